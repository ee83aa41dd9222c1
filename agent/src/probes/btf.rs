//! A reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find where a member
//! sits in a struct and what an enumerator is worth.
//!
//! Rust eBPF has no CO-RE relocations in aya 0.14, so the agent resolves kernel layout here at load
//! time and hands the numbers to the programs as constants. Members inside anonymous structs and
//! unions (such as `vm_area_struct.vm_flags` since 6.3) are found by descending into them.
//! The format is described in the kernel's `Documentation/bpf/btf.rst`.

use std::collections::HashMap;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;
const KIND_MAX: u32 = 19;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF: magic {found:#06x}, expected {MAGIC:#06x} (little-endian)")]
    BadMagic { found: u16 },
    #[error("BTF truncated: {what} needs bytes {start}..{end} of {len}")]
    Truncated {
        what: &'static str,
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("BTF type {id} has unknown kind {kind}")]
    UnknownKind { id: u32, kind: u32 },
    #[error("BTF string offset {offset} is outside the string section")]
    BadString { offset: u32 },
    #[error("no struct or union named `{0}` in BTF")]
    NoSuchStruct(String),
    #[error("struct `{ty}` has no member `{member}` in BTF")]
    NoSuchMember { ty: String, member: String },
    #[error("`{ty}.{member}` is a bitfield; only whole members have a byte offset")]
    Bitfield { ty: String, member: String },
    #[error("no enumerator named `{0}` in BTF")]
    NoSuchEnumerator(String),
    #[error("no typedef `{0}` of a function pointer in BTF")]
    NoSuchFunctionType(String),
    #[error("no function `{0}` in BTF")]
    NoSuchFunction(String),
    #[error("`{ty}.{member}` is at byte {found}, where the program reads byte {expected}")]
    Layout {
        ty: String,
        member: String,
        found: u64,
        expected: u64,
    },
    #[error("`{name}` takes {found:?}, expected {expected:?}")]
    Prototype {
        name: String,
        found: Vec<Shape>,
        expected: Vec<Shape>,
    },
}

/// What a function parameter is, as far as a raw tracepoint's arguments are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Pointer,
    Integer { bytes: u32 },
    Other,
}

/// One member of a struct or union.
#[derive(Debug, Clone, Copy)]
struct Member {
    name: u32,
    type_id: u32,
    bit_offset: u32,
    bitfield_size: u32,
}

/// The parsed types: composites by name, members, and enumerators.
#[derive(Debug, Default)]
pub struct Btf {
    strings: Vec<u8>,
    /// type id -> members, for structs and unions.
    members: HashMap<u32, Vec<Member>>,
    /// struct or union name -> first type id with that name.
    composites: HashMap<String, u32>,
    /// type id -> referenced type id, for modifiers and typedefs (so anonymous members resolve).
    aliases: HashMap<u32, u32>,
    /// enumerator name -> value.
    enumerators: HashMap<String, i64>,
    /// type id -> (kind, size or referenced type), for every type.
    kinds: HashMap<u32, (u32, u32)>,
    /// typedef name -> type id of the typedef.
    typedefs: HashMap<String, u32>,
    /// type id -> parameter type ids, for function prototypes.
    params: HashMap<u32, Vec<u32>>,
    /// function name -> its type id (what an fentry or fexit program names as attach_btf_id);
    /// kept only by [`Btf::parse_with_functions`]: vmlinux has tens of thousands.
    functions: Option<HashMap<String, u32>>,
}

impl Btf {
    /// Parses a whole BTF blob: its structs, enums, typedefs and prototypes, not its functions.
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        Btf::parse_keeping(data, None)
    }

    /// [`Btf::parse`], keeping the functions' type ids too ([`Btf::function`]).
    pub fn parse_with_functions(data: &[u8]) -> Result<Btf, BtfError> {
        Btf::parse_keeping(data, Some(HashMap::new()))
    }

    fn parse_keeping(
        data: &[u8],
        functions: Option<HashMap<String, u32>>,
    ) -> Result<Btf, BtfError> {
        let magic_bytes = slice(data, 0, 2, "magic")?;
        let magic = u16::from_le_bytes([magic_bytes[0], magic_bytes[1]]);
        if magic != MAGIC {
            return Err(BtfError::BadMagic { found: magic });
        }
        let header_len = read_u32(data, 4, "header")? as usize;
        let type_off = read_u32(data, 8, "header")? as usize;
        let type_len = read_u32(data, 12, "header")? as usize;
        let str_off = read_u32(data, 16, "header")? as usize;
        let str_len = read_u32(data, 20, "header")? as usize;
        let header_len = header_len.max(HEADER_LEN);
        let types = slice(data, header_len + type_off, type_len, "type section")?;
        let strings = slice(data, header_len + str_off, str_len, "string section")?.to_vec();
        let mut btf = Btf {
            strings,
            functions,
            ..Btf::default()
        };
        btf.read_types(types)?;
        Ok(btf)
    }

    fn read_types(&mut self, types: &[u8]) -> Result<(), BtfError> {
        let mut pos = 0;
        let mut id = 1u32;
        while pos < types.len() {
            let name = read_u32(types, pos, "type")?;
            let info = read_u32(types, pos + 4, "type")?;
            let size_or_type = read_u32(types, pos + 8, "type")?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            pos += 12;
            if kind == 0 || kind > KIND_MAX {
                return Err(BtfError::UnknownKind { id, kind });
            }
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => 0,
            };
            let body = slice(types, pos, extra, "type body")?;
            match kind {
                KIND_STRUCT | KIND_UNION => self.add_composite(id, name, kind_flag, body)?,
                KIND_ENUM => self.add_enum(body, 8, |e| {
                    i64::from(read_u32(e, 4, "enum").unwrap_or(0) as i32)
                })?,
                KIND_ENUM64 => self.add_enum(body, 12, |e| {
                    let lo = u64::from(read_u32(e, 4, "enum64").unwrap_or(0));
                    let hi = u64::from(read_u32(e, 8, "enum64").unwrap_or(0));
                    ((hi << 32) | lo) as i64
                })?,
                // typedef, volatile, const, restrict, type_tag: follow them through anonymous members.
                8..=11 | 18 => {
                    self.aliases.insert(id, size_or_type);
                    if kind == KIND_TYPEDEF && name != 0 {
                        let name = self.string(name)?.to_owned();
                        self.typedefs.entry(name).or_insert(id);
                    }
                }
                KIND_FUNC if name != 0 && self.functions.is_some() => {
                    let name = self.string(name)?.to_owned();
                    if let Some(functions) = &mut self.functions {
                        functions.entry(name).or_insert(id);
                    }
                }
                KIND_FUNC_PROTO => {
                    let params = body
                        .chunks_exact(8)
                        .map(|p| read_u32(p, 4, "parameter"))
                        .collect::<Result<Vec<_>, _>>()?;
                    self.params.insert(id, params);
                }
                _ => {}
            }
            self.kinds.insert(id, (kind, size_or_type));
            pos += extra;
            id += 1;
        }
        Ok(())
    }

    fn add_composite(
        &mut self,
        id: u32,
        name: u32,
        kind_flag: bool,
        body: &[u8],
    ) -> Result<(), BtfError> {
        let members = body
            .chunks_exact(12)
            .map(|m| {
                let offset = read_u32(m, 8, "member")?;
                let (bit_offset, bitfield_size) = if kind_flag {
                    (offset & 0x00ff_ffff, offset >> 24)
                } else {
                    (offset, 0)
                };
                Ok(Member {
                    name: read_u32(m, 0, "member")?,
                    type_id: read_u32(m, 4, "member")?,
                    bit_offset,
                    bitfield_size,
                })
            })
            .collect::<Result<Vec<_>, BtfError>>()?;
        if name != 0 {
            let name = self.string(name)?.to_owned();
            self.composites.entry(name).or_insert(id);
        }
        self.members.insert(id, members);
        Ok(())
    }

    fn add_enum(
        &mut self,
        body: &[u8],
        stride: usize,
        value: impl Fn(&[u8]) -> i64,
    ) -> Result<(), BtfError> {
        for e in body.chunks_exact(stride) {
            let name = self.string(read_u32(e, 0, "enumerator")?)?.to_owned();
            self.enumerators.entry(name).or_insert_with(|| value(e));
        }
        Ok(())
    }

    fn string(&self, offset: u32) -> Result<&str, BtfError> {
        let rest = self
            .strings
            .get(offset as usize..)
            .ok_or(BtfError::BadString { offset })?;
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(BtfError::BadString { offset })?;
        std::str::from_utf8(&rest[..end]).map_err(|_| BtfError::BadString { offset })
    }

    /// Byte offset of `member` in the struct or union `ty`, looking inside anonymous members.
    pub fn member_offset(&self, ty: &str, member: &str) -> Result<u64, BtfError> {
        let id = *self
            .composites
            .get(ty)
            .ok_or_else(|| BtfError::NoSuchStruct(ty.to_owned()))?;
        let no_member = || BtfError::NoSuchMember {
            ty: ty.to_owned(),
            member: member.to_owned(),
        };
        let found = self.find_member(id, member, 0)?.ok_or_else(no_member)?;
        if found.bitfield_size != 0 || found.bit_offset % 8 != 0 {
            return Err(BtfError::Bitfield {
                ty: ty.to_owned(),
                member: member.to_owned(),
            });
        }
        Ok(u64::from(found.bit_offset / 8))
    }

    fn find_member(&self, id: u32, name: &str, base_bits: u32) -> Result<Option<Member>, BtfError> {
        let Some(members) = self.members.get(&id) else {
            return Ok(None);
        };
        for m in members {
            let bits = base_bits + m.bit_offset;
            if m.name == 0 {
                if let Some(found) = self.find_member(self.resolve(m.type_id), name, bits)? {
                    return Ok(Some(found));
                }
            } else if self.string(m.name)? == name {
                return Ok(Some(Member {
                    bit_offset: bits,
                    ..*m
                }));
            }
        }
        Ok(None)
    }

    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.aliases.get(&id) {
                Some(&next) => id = next,
                None => break,
            }
        }
        id
    }

    /// Drops a struct, as an older kernel's BTF might lack it.
    #[cfg(test)]
    pub fn forget_struct(&mut self, ty: &str) {
        self.composites.remove(ty);
    }

    /// Drops a typedef, as an older kernel's BTF lacks a tracepoint's `btf_trace_*`.
    #[cfg(test)]
    pub fn forget_typedef(&mut self, name: &str) {
        self.typedefs.remove(name);
    }

    /// The parameters of the function type behind the typedef `name` (a function pointer, as the
    /// kernel's `btf_trace_<tracepoint>` typedefs are).
    pub fn function_params(&self, name: &str) -> Result<Vec<Shape>, BtfError> {
        let not_found = || BtfError::NoSuchFunctionType(name.to_owned());
        let typedef = *self.typedefs.get(name).ok_or_else(not_found)?;
        let target = self.resolve(typedef);
        let proto = match self.kinds.get(&target) {
            Some(&(KIND_PTR, pointee)) => self.resolve(pointee),
            _ => target,
        };
        let params = self.params.get(&proto).ok_or_else(not_found)?;
        Ok(params.iter().map(|&p| self.shape(p)).collect())
    }

    fn shape(&self, id: u32) -> Shape {
        match self.kinds.get(&self.resolve(id)) {
            Some(&(KIND_PTR, _)) => Shape::Pointer,
            Some(&(KIND_INT, bytes)) => Shape::Integer { bytes },
            _ => Shape::Other,
        }
    }

    /// The type id of the kernel function `name` (`BTF_KIND_FUNC`): the `attach_btf_id` of an
    /// fentry or fexit program on it. Known only when parsed by [`Btf::parse_with_functions`].
    pub fn function(&self, name: &str) -> Result<u32, BtfError> {
        self.functions
            .as_ref()
            .and_then(|f| f.get(name))
            .copied()
            .ok_or_else(|| BtfError::NoSuchFunction(name.to_owned()))
    }

    /// Value of the enumerator `name` (from any enum).
    pub fn enumerator(&self, name: &str) -> Result<i64, BtfError> {
        self.enumerators
            .get(name)
            .copied()
            .ok_or_else(|| BtfError::NoSuchEnumerator(name.to_owned()))
    }
}

fn slice<'a>(
    data: &'a [u8],
    start: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a [u8], BtfError> {
    let end = start.saturating_add(len);
    data.get(start..end).ok_or(BtfError::Truncated {
        what,
        start,
        end,
        len: data.len(),
    })
}

fn read_u32(data: &[u8], at: usize, what: &'static str) -> Result<u32, BtfError> {
    let bytes = slice(data, at, 4, what)?;
    Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

#[cfg(test)]
mod tests;
