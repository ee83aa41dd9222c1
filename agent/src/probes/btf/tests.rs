use super::*;

/// Builds BTF blobs for tests: types are appended in id order starting at 1.
#[derive(Default)]
struct Builder {
    types: Vec<u8>,
    strings: Vec<u8>,
}

impl Builder {
    fn new() -> Self {
        Builder {
            types: Vec::new(),
            strings: vec![0],
        }
    }
    fn name(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0;
        }
        let at = self.strings.len() as u32;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        at
    }
    fn head(&mut self, name: &str, kind: u32, vlen: u32, kind_flag: bool, size_or_type: u32) {
        let n = self.name(name);
        let info = (kind << 24) | vlen | if kind_flag { 1 << 31 } else { 0 };
        for w in [n, info, size_or_type] {
            self.types.extend_from_slice(&w.to_le_bytes());
        }
    }
    fn int(&mut self, name: &str, bytes: u32) {
        self.head(name, KIND_INT, 0, false, bytes);
        self.types.extend_from_slice(&(bytes * 8).to_le_bytes());
    }
    /// `members`: (name, type id, bit offset, bitfield size).
    fn composite(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32, u32)]) {
        let kind_flag = members.iter().any(|m| m.3 != 0);
        self.head(name, kind, members.len() as u32, kind_flag, size);
        for &(m, ty, bits, bitfield) in members {
            let n = self.name(m);
            let offset = if kind_flag {
                bits | (bitfield << 24)
            } else {
                bits
            };
            for w in [n, ty, offset] {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
        }
    }
    fn typedef(&mut self, name: &str, ty: u32) {
        self.head(name, 8, 0, false, ty);
    }
    fn enumeration(&mut self, values: &[(&str, i32)]) {
        self.head("", KIND_ENUM, values.len() as u32, false, 4);
        for &(n, v) in values {
            let n = self.name(n);
            self.types.extend_from_slice(&n.to_le_bytes());
            self.types.extend_from_slice(&v.to_le_bytes());
        }
    }
    /// A function prototype returning void with parameters of the given type ids.
    fn func_proto(&mut self, params: &[u32]) {
        self.head("", KIND_FUNC_PROTO, params.len() as u32, false, 0);
        for &ty in params {
            self.types.extend_from_slice(&0u32.to_le_bytes());
            self.types.extend_from_slice(&ty.to_le_bytes());
        }
    }
    fn pointer(&mut self, to: u32) {
        self.head("", KIND_PTR, 0, false, to);
    }
    fn finish(self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            HEADER_LEN as u32,
            0,
            self.types.len() as u32,
            self.types.len() as u32,
            self.strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// A `vm_area_struct` shaped like 6.18's: `vm_flags` inside an anonymous union reached through a
/// const-qualified typedef, behind an anonymous struct.
fn vma_like() -> Vec<u8> {
    let mut b = Builder::new();
    b.int("long unsigned int", 8); // 1
    b.composite(
        KIND_UNION,
        "",
        8,
        &[("vm_flags", 1, 0, 0), ("__vm_flags", 1, 0, 0)],
    ); // 2
    b.typedef("flags_union_t", 2); // 3
    b.head("", 10, 0, false, 3); // 4: const flags_union_t
    b.composite(
        KIND_STRUCT,
        "",
        16,
        &[("vm_start", 1, 0, 0), ("vm_end", 1, 64, 0)],
    ); // 5
    b.composite(
        KIND_STRUCT,
        "vm_area_struct",
        64,
        &[
            ("", 5, 0, 0),
            ("vm_mm", 1, 128, 0),
            ("", 4, 256, 0),
            ("vm_file", 1, 320, 0),
        ],
    ); // 6
    b.composite(KIND_STRUCT, "packed", 8, &[("a", 1, 0, 3), ("b", 1, 3, 5)]); // 7
    b.enumeration(&[("VMA_HUGETLB_BIT", 22), ("VMA_OTHER_BIT", 3)]); // 8
    b.finish()
}

#[test]
fn member_offsets_include_anonymous_parents() {
    let btf = Btf::parse(&vma_like()).expect("parse");
    assert_eq!(btf.member_offset("vm_area_struct", "vm_start"), Ok(0));
    assert_eq!(btf.member_offset("vm_area_struct", "vm_end"), Ok(8));
    assert_eq!(btf.member_offset("vm_area_struct", "vm_mm"), Ok(16));
    assert_eq!(btf.member_offset("vm_area_struct", "vm_flags"), Ok(32));
    assert_eq!(btf.member_offset("vm_area_struct", "vm_file"), Ok(40));
}

#[test]
fn missing_struct_and_member_are_named() {
    let btf = Btf::parse(&vma_like()).expect("parse");
    let err = btf.member_offset("task_struct", "pid").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no struct or union named `task_struct` in BTF"
    );
    let err = btf.member_offset("vm_area_struct", "vm_pgoff").unwrap_err();
    assert_eq!(
        err.to_string(),
        "struct `vm_area_struct` has no member `vm_pgoff` in BTF"
    );
}

#[test]
fn bitfields_have_no_byte_offset() {
    let btf = Btf::parse(&vma_like()).expect("parse");
    assert!(matches!(
        btf.member_offset("packed", "b"),
        Err(BtfError::Bitfield { .. })
    ));
}

#[test]
fn enumerators_are_found_by_name() {
    let btf = Btf::parse(&vma_like()).expect("parse");
    assert_eq!(btf.enumerator("VMA_HUGETLB_BIT"), Ok(22));
    assert_eq!(
        btf.enumerator("VMA_NOPE"),
        Err(BtfError::NoSuchEnumerator("VMA_NOPE".into()))
    );
}

#[test]
fn big_endian_or_foreign_data_is_rejected() {
    let mut blob = vma_like();
    blob[0] = 0xeb;
    blob[1] = 0x9f;
    assert_eq!(
        Btf::parse(&blob).unwrap_err(),
        BtfError::BadMagic { found: 0x9feb }
    );
}

#[test]
fn truncated_blob_is_an_error_not_a_panic() {
    let blob = vma_like();
    for cut in [0, 3, 23, 30, blob.len() - 1] {
        assert!(Btf::parse(&blob[..cut]).is_err(), "cut at {cut} parsed");
    }
}

#[test]
fn unknown_kind_is_rejected() {
    let mut b = Builder::new();
    b.head("x", 31, 0, false, 0);
    assert_eq!(
        Btf::parse(&b.finish()).unwrap_err(),
        BtfError::UnknownKind { id: 1, kind: 31 }
    );
}

/// `typedef void (*btf_trace_page_fault_user)(void *, unsigned long, struct pt_regs *, unsigned long)`
fn raw_tracepoint_typedef(third: Option<u32>) -> Vec<u8> {
    let mut b = Builder::new();
    b.int("long unsigned int", 8); // 1
    b.composite(KIND_STRUCT, "pt_regs", 168, &[]); // 2
    b.pointer(0); // 3: void *
    b.pointer(2); // 4: struct pt_regs *
    b.typedef("ulong", 1); // 5
    b.func_proto(&[3, 5, third.unwrap_or(4), 1]); // 6
    b.pointer(6); // 7
    b.typedef("btf_trace_page_fault_user", 7); // 8
    b.finish()
}

#[test]
fn raw_tracepoint_prototypes_are_read_through_typedefs_and_pointers() {
    let btf = Btf::parse(&raw_tracepoint_typedef(None)).expect("parse");
    let params = btf
        .function_params("btf_trace_page_fault_user")
        .expect("prototype");
    assert_eq!(
        params,
        [
            Shape::Pointer,
            Shape::Integer { bytes: 8 },
            Shape::Pointer,
            Shape::Integer { bytes: 8 }
        ]
    );
    let changed = Btf::parse(&raw_tracepoint_typedef(Some(1))).expect("parse");
    let params = changed
        .function_params("btf_trace_page_fault_user")
        .expect("prototype");
    assert_eq!(params[2], Shape::Integer { bytes: 8 });
    assert_eq!(
        btf.function_params("btf_trace_nope"),
        Err(BtfError::NoSuchFunctionType("btf_trace_nope".into()))
    );
}

#[test]
fn functions_are_found_by_name_with_their_type_id() {
    let mut b = Builder::new();
    b.int("int", 4); // 1
    b.func_proto(&[1]); // 2
    b.head("hugetlb_fault", KIND_FUNC, 1, false, 2); // 3
    b.head("", KIND_FUNC, 0, false, 2); // 4: nameless, ignored
    b.head("other", KIND_FUNC, 1, false, 2); // 5
    let blob = b.finish();
    let btf = Btf::parse_with_functions(&blob).expect("parse");
    assert_eq!(btf.function("hugetlb_fault"), Ok(3));
    assert_eq!(btf.function("other"), Ok(5));
    assert_eq!(
        btf.function("int"),
        Err(BtfError::NoSuchFunction("int".into()))
    );
    // The agent's own parse keeps no functions (vmlinux has tens of thousands).
    let lean = Btf::parse(&blob).expect("parse");
    assert_eq!(
        lean.function("hugetlb_fault"),
        Err(BtfError::NoSuchFunction("hugetlb_fault".into()))
    );
}
