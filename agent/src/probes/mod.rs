//! Sole owner of the loaded eBPF object: loads the embedded programs with kernel offsets from BTF,
//! attaches each to its tracepoint (the fault program where the kernel allows: its fexit twin on
//! `hugetlb_fault`, which sees each fault done, else the tracepoint, or the fentry twin where the
//! tracepoint cannot work: [`FaultPath`]), hands out the ring buffers, and keeps the filter maps.
//!
//! Dropping [`Probes`] detaches every program. What the agent does with events lives elsewhere
//! ([`events`] decodes them; the run loop consumes them).

pub mod btf;
mod caps;
mod errno;
pub mod events;
mod files;
pub mod flags;
pub mod live;
pub mod offsets;
pub mod retries;
pub mod stream;
pub mod tasks;
mod tracefs;
pub mod watch;

use std::{collections::BTreeSet, sync::Arc};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, RingBuf},
    programs::{
        FEntry, FExit, Program, ProgramError, RawTracePoint, TracePoint, fentry::FEntryLinkId,
        fexit::FExitLinkId, raw_trace_point::RawTracePointLinkId,
    },
};
use hugepage_agent_common::{
    cgroup,
    counters::Counter,
    offsets::GLOBAL as OFFSETS_GLOBAL,
    page_fault_user::{self, CgroupVerdict, FaultSettings},
};

use self::flags::FaultAttach;
use crate::sysfs::{HostFs, SysfsError};
pub use errno::errno_name;

/// The kernel object built from `ebpf/` (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hugepage-agent-probes"));

const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// The fault program: name in the object, tracepoint category, tracepoint name. It is attached as
/// a raw tracepoint: the classic tracepoint's perf record alone costs an ordinary fault ~13 %.
pub const FAULT_PROGRAM: (&str, &str, &str) = ("page_fault_user", "exceptions", "page_fault_user");
/// The fault program's fentry twin: name in the object, and the kernel function it attaches to.
pub const FAULT_FENTRY: (&str, &str) = ("hugetlb_fault", "hugetlb_fault");
/// The fault program's fexit twin, which sees each fault done: name, kernel function.
pub const FAULT_FEXIT: (&str, &str) = ("hugetlb_fault_done", "hugetlb_fault");
/// `1` on PREEMPT_RT kernels, absent elsewhere.
const REALTIME: &str = "/sys/kernel/realtime";
/// The cgroup programs (classic tracepoints), in the same form.
pub const CGROUP_PROGRAMS: [(&str, &str, &str); 4] = [
    ("cgroup_mkdir", "cgroup", "cgroup_mkdir"),
    ("cgroup_rmdir", "cgroup", "cgroup_rmdir"),
    ("cgroup_attach_task", "cgroup", "cgroup_attach_task"),
    ("cgroup_release", "cgroup", "cgroup_release"),
];

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("this binary carries no eBPF object (it was built with AYA_BUILD_SKIP=1)")]
    NotBuilt,
    #[error("reading the kernel's BTF: {0}")]
    BtfRead(#[source] SysfsError),
    #[error("kernel BTF {BTF_PATH}: {0}")]
    Btf(#[source] btf::BtfError),
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    #[error("loading the eBPF object: {0}")]
    Object(#[source] Box<EbpfError>),
    #[error("eBPF program {program} refused by the kernel: {source}")]
    ProgramLoad {
        program: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("attaching eBPF program {program} to tracepoint {category}/{tracepoint}: {source}")]
    Attach {
        program: &'static str,
        category: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error(
        "attaching eBPF program {program} to kernel function {function} (fentry or fexit): {source}"
    )]
    AttachTracing {
        program: &'static str,
        function: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("reading the kernel's BTF for fentry, fexit or the task iterators: {0}")]
    TracingBtf(#[source] Box<aya::BtfError>),
    #[error("detaching eBPF program {program}: {source}")]
    Detach {
        program: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        kind: &'static str,
        name: &'static str,
    },
    #[error(transparent)]
    Tasks(#[from] tasks::TasksError),
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
}

impl ProbeError {
    /// The errno behind the error, when a system call failed.
    pub fn errno(&self) -> Option<i32> {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(err) = source {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && let Some(code) = io.raw_os_error()
            {
                return Some(code);
            }
            source = err.source();
        }
        None
    }

    /// One line for an operator: the error, its causes, and the errno by name.
    pub fn explain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(err) = source {
            let cause = err.to_string();
            if !text.contains(&cause) {
                text.push_str(": ");
                text.push_str(&cause);
            }
            source = err.source();
        }
        if let Some(code) = self.errno() {
            text.push_str(&format!(" [{}]", errno_name(code)));
            let kernel_refused = matches!(
                self,
                ProbeError::Object(_)
                    | ProbeError::ProgramLoad { .. }
                    | ProbeError::Attach { .. }
                    | ProbeError::AttachTracing { .. }
            );
            if code == libc::EPERM
                && kernel_refused
                && let Some(effective) = caps::effective()
            {
                text.push_str(": ");
                text.push_str(&caps::eperm_hint(effective));
            }
        }
        text
    }
}

/// The ring buffers, to be read by the event loop.
pub struct EventStreams {
    pub faults: RingBuf<MapData>,
    pub cgroups: RingBuf<MapData>,
    /// The hugetlbfs programs', where the kernel has them ([`Probes::files_unavailable`]).
    pub files: Option<RingBuf<MapData>>,
}

/// Per-CPU counters summed over CPUs, indexed by [`Counter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters([u64; Counter::COUNT as usize]);

impl Counters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// Every fault the program ran for: the sum of its outcomes.
    pub fn faults_seen(&self) -> u64 {
        Counter::FAULT_OUTCOMES.iter().map(|&c| self.get(c)).sum()
    }
}

/// Where the fault program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPath {
    /// The raw tracepoint `exceptions/page_fault_user` ([`FAULT_PROGRAM`]).
    Tracepoint,
    /// fentry on `hugetlb_fault` ([`FAULT_FENTRY`]).
    Fentry,
    /// fexit on `hugetlb_fault` ([`FAULT_FEXIT`]): each fault seen done.
    Fexit,
}

impl FaultPath {
    /// What `attach` resolves to on this host: the path tried first, and the one taken when the
    /// kernel refuses it. `auto` is fexit, else the tracepoint (fentry on a PREEMPT_RT kernel,
    /// where the tracepoint sees no hugetlb fault).
    pub fn resolve(attach: FaultAttach, host: &HostFs) -> (FaultPath, Option<FaultPath>) {
        match attach {
            FaultAttach::Tracepoint => (FaultPath::Tracepoint, None),
            FaultAttach::Fentry => (FaultPath::Fentry, None),
            FaultAttach::Fexit => (FaultPath::Fexit, None),
            FaultAttach::Auto if realtime(host) => (FaultPath::Fexit, Some(FaultPath::Fentry)),
            FaultAttach::Auto => (FaultPath::Fexit, Some(FaultPath::Tracepoint)),
        }
    }

    /// `raw_tracepoint exceptions/page_fault_user`, `fentry hugetlb_fault` or
    /// `fexit hugetlb_fault`, for the log.
    pub fn describe(self) -> String {
        match self {
            FaultPath::Tracepoint => {
                format!("raw_tracepoint {}/{}", FAULT_PROGRAM.1, FAULT_PROGRAM.2)
            }
            FaultPath::Fentry => format!("fentry {}", FAULT_FENTRY.1),
            FaultPath::Fexit => format!("fexit {}", FAULT_FEXIT.1),
        }
    }

    /// The program's name in the object.
    fn program(self) -> &'static str {
        match self {
            FaultPath::Tracepoint => FAULT_PROGRAM.0,
            FaultPath::Fentry => FAULT_FENTRY.0,
            FaultPath::Fexit => FAULT_FEXIT.0,
        }
    }
}

/// Whether the kernel is a PREEMPT_RT build (`/sys/kernel/realtime` says 1).
fn realtime(host: &HostFs) -> bool {
    host.read_string(REALTIME).is_ok_and(|r| r.trim() == "1")
}

/// The fault program's link, by where it runs.
enum FaultLink {
    Tracepoint(RawTracePointLinkId),
    Fentry(FEntryLinkId),
    Fexit(FExitLinkId),
}

/// The loaded and attached programs and the maps the agent writes.
pub struct Probes {
    ebpf: Ebpf,
    watched: HashMap<MapData, u64, u8>,
    watched_ids: BTreeSet<u64>,
    settings: Array<MapData, FaultSettings>,
    /// What `settings` holds: the flags and the watch map's generation.
    current: FaultSettings,
    counters: PerCpuArray<MapData, u64>,
    verdicts: PerCpuArray<MapData, CgroupVerdict>,
    fault_link: Option<FaultLink>,
    /// Where the fault program runs.
    pub fault_path: FaultPath,
    /// Why the path tried first was refused, when the fault program runs on the fallback.
    pub fault_fallback: Option<String>,
    /// Why faults carry page size 0, when the kernel's BTF lacks the hugetlbfs layout.
    pub page_size_unavailable: Option<btf::BtfError>,
    /// What faults carry less of, and why: no file, or no SysV segment's IPC namespace.
    pub file_unavailable: Option<String>,
    /// Why the hugetlbfs programs are not attached, when they are not.
    pub files_unavailable: Option<String>,
    /// The task iterators, for the walk of the holders, or why they are not loaded.
    pub tasks: Result<Arc<tasks::TaskIterators>, String>,
    /// Reads aya-log records of the programs; `None` when the object has no log map.
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl Probes {
    /// Loads the object, attaches every program (the fault program where `attach` resolves to),
    /// and returns the ring buffers. Nothing is left attached when this fails.
    pub fn load(host: &HostFs, attach: FaultAttach) -> Result<(Probes, EventStreams), ProbeError> {
        if OBJECT.is_empty() {
            return Err(ProbeError::NotBuilt);
        }
        let btf_bytes = host.read_bytes(BTF_PATH).map_err(ProbeError::BtfRead)?;
        let kernel_btf = btf::Btf::parse(&btf_bytes).map_err(ProbeError::Btf)?;
        let resolved = offsets::resolve(&kernel_btf, base_page_size()).map_err(ProbeError::Btf)?;
        drop(kernel_btf);
        // No kernel BTF for aya: it would parse all of vmlinux's types (tens of MB, kept by the
        // allocator afterwards) for CO-RE relocations, which these programs do not have; the
        // offsets they need come from our own reader above, as globals.
        let mut ebpf = EbpfLoader::new()
            .btf(None)
            .override_global(OFFSETS_GLOBAL, &resolved.offsets, true)
            .load(OBJECT)
            .map_err(|e| ProbeError::Object(Box::new(e)))?;
        let logger = aya_log::EbpfLogger::init(&mut ebpf).ok();
        // The verifier judges every program before anything is attached.
        for (program, _, _) in CGROUP_PROGRAMS {
            let loaded = self::program::<TracePoint>(&mut ebpf, program)?.load();
            loaded.map_err(load_err(program))?;
        }
        let mut files_unavailable = match &resolved.hugetlbfs_unavailable {
            Some(why) => Some(format!(
                "the kernel's BTF: {why} (kernels newer than 6.12 have them)"
            )),
            None => files::load(&mut ebpf).err().map(|e| e.explain()),
        };
        // aya's own BTF reader, for the BTF ids of fentry's function and the iterators' targets:
        // parsed once when needed, and dropped before the programs attach.
        let mut aya_btf = None;
        let (fault_path, fault_fallback) = load_fault(
            &mut ebpf,
            &btf_bytes,
            &mut aya_btf,
            FaultPath::resolve(attach, host),
        )?;
        let tasks = match (&resolved.tasks_unavailable, own_pid_namespace(host)) {
            (Some(why), _) => Err(format!("the kernel's BTF: {why}")),
            (None, Some(why)) => Err(why),
            (None, None) => parsed(&mut aya_btf, &btf_bytes)
                .and_then(|btf| tasks::TaskIterators::load(&mut ebpf, btf))
                .map(Arc::new)
                .map_err(|e| e.explain()),
        };
        drop(aya_btf);
        drop(btf_bytes);
        tracefs::ensure_mounted()?;
        for (program, category, tracepoint) in CGROUP_PROGRAMS {
            self::program::<TracePoint>(&mut ebpf, program)?
                .attach(category, tracepoint)
                .map_err(attach_err((program, category, tracepoint)))?;
        }
        let fault_link = Some(attach_fault(&mut ebpf, fault_path)?);
        let files = match files_unavailable {
            Some(_) => None,
            None => files::attach(&mut ebpf)
                .map_err(|e| files_unavailable = Some(e.explain()))
                .ok(),
        };
        let streams = EventStreams {
            faults: RingBuf::try_from(take_map(&mut ebpf, page_fault_user::EVENTS_MAP)?)
                .map_err(map_err(page_fault_user::EVENTS_MAP))?,
            cgroups: RingBuf::try_from(take_map(&mut ebpf, cgroup::EVENTS_MAP)?)
                .map_err(map_err(cgroup::EVENTS_MAP))?,
            files,
        };
        let probes = Probes {
            watched: HashMap::try_from(take_map(&mut ebpf, page_fault_user::WATCHED_CGROUPS_MAP)?)
                .map_err(map_err(page_fault_user::WATCHED_CGROUPS_MAP))?,
            settings: Array::try_from(take_map(&mut ebpf, page_fault_user::SETTINGS_MAP)?)
                .map_err(map_err(page_fault_user::SETTINGS_MAP))?,
            counters: PerCpuArray::try_from(take_map(
                &mut ebpf,
                hugepage_agent_common::counters::MAP,
            )?)
            .map_err(map_err(hugepage_agent_common::counters::MAP))?,
            verdicts: PerCpuArray::try_from(take_map(
                &mut ebpf,
                page_fault_user::VERDICT_CACHE_MAP,
            )?)
            .map_err(map_err(page_fault_user::VERDICT_CACHE_MAP))?,
            ebpf,
            watched_ids: BTreeSet::new(),
            current: FaultSettings::default(),
            fault_link,
            fault_path,
            fault_fallback,
            page_size_unavailable: resolved.page_size_unavailable,
            file_unavailable: match (resolved.file_unavailable, resolved.ipc_ns_unavailable) {
                (Some(e), _) => Some(format!(
                    "faults will carry no file: the kernel's BTF lacks {e}"
                )),
                (None, Some(e)) => Some(format!(
                    "a SysV segment's faults will carry no IPC namespace (booked as a file's): the kernel's BTF lacks {e}"
                )),
                (None, None) => None,
            },
            files_unavailable,
            tasks,
            logger,
        };
        Ok((probes, streams))
    }

    /// Inspect the faults of every process (`true`) or only of watched cgroups (`false`).
    pub fn set_watch_all(&mut self, all: bool) -> Result<(), ProbeError> {
        self.set_flag(page_fault_user::settings::WATCH_ALL, all)
    }

    /// Whether faults of every process are inspected (no cgroup filter).
    pub fn watches_all(&self) -> bool {
        self.current.flags & page_fault_user::settings::WATCH_ALL != 0
    }

    /// Make the fault program return at once (`true`), for measuring the attach cost alone.
    pub fn set_paused(&mut self, paused: bool) -> Result<(), ProbeError> {
        self.set_flag(page_fault_user::settings::PAUSE, paused)
    }

    fn set_flag(&mut self, flag: u32, on: bool) -> Result<(), ProbeError> {
        if on {
            self.current.flags |= flag;
        } else {
            self.current.flags &= !flag;
        }
        self.write_settings()
    }

    /// Makes the watched set equal to `ids`, changing only what differs.
    pub fn sync_watched(&mut self, ids: &BTreeSet<u64>) -> Result<(), ProbeError> {
        let stale: Vec<u64> = self.watched_ids.difference(ids).copied().collect();
        let new: Vec<u64> = ids.difference(&self.watched_ids).copied().collect();
        if stale.is_empty() && new.is_empty() {
            return Ok(());
        }
        for id in stale {
            self.remove(id)?;
        }
        for id in new {
            self.insert(id)?;
        }
        self.bump_generation()
    }

    pub fn watch(&mut self, cgroup_id: u64) -> Result<(), ProbeError> {
        if self.insert(cgroup_id)? {
            self.bump_generation()?;
        }
        Ok(())
    }

    pub fn unwatch(&mut self, cgroup_id: u64) -> Result<(), ProbeError> {
        if self.remove(cgroup_id)? {
            self.bump_generation()?;
        }
        Ok(())
    }

    /// Adds `cgroup_id` to the kernel map; `true` when it was not there.
    fn insert(&mut self, cgroup_id: u64) -> Result<bool, ProbeError> {
        if self.watched_ids.contains(&cgroup_id) {
            return Ok(false);
        }
        self.watched
            .insert(cgroup_id, page_fault_user::WATCHED, 0)
            .map_err(map_err(page_fault_user::WATCHED_CGROUPS_MAP))?;
        self.watched_ids.insert(cgroup_id);
        Ok(true)
    }

    /// Removes `cgroup_id` from the kernel map; `true` when it was there.
    fn remove(&mut self, cgroup_id: u64) -> Result<bool, ProbeError> {
        if !self.watched_ids.remove(&cgroup_id) {
            return Ok(false);
        }
        match self.watched.remove(&cgroup_id) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(true),
            Err(source) => Err(map_err(page_fault_user::WATCHED_CGROUPS_MAP)(source)),
        }
    }

    /// Invalidates every CPU's cached verdict. Called after the map changed, never before: a
    /// program that reads the new generation then reads the new map.
    fn bump_generation(&mut self) -> Result<(), ProbeError> {
        self.current.generation = self.current.generation.wrapping_add(1);
        self.write_settings()
    }

    fn write_settings(&mut self) -> Result<(), ProbeError> {
        self.settings
            .set(0, self.current, 0)
            .map_err(map_err(page_fault_user::SETTINGS_MAP))
    }

    /// Detaches the fault program (the cgroup programs stay); for measuring its cost.
    pub fn detach_faults(&mut self) -> Result<(), ProbeError> {
        let detach_err = |program| {
            move |source| ProbeError::Detach {
                program,
                source: Box::new(source),
            }
        };
        match self.fault_link.take() {
            Some(FaultLink::Tracepoint(link)) => {
                let program = FAULT_PROGRAM.0;
                self::program::<RawTracePoint>(&mut self.ebpf, program)?
                    .detach(link)
                    .map_err(detach_err(program))?;
            }
            Some(FaultLink::Fentry(link)) => {
                let program = FAULT_FENTRY.0;
                self::program::<FEntry>(&mut self.ebpf, program)?
                    .detach(link)
                    .map_err(detach_err(program))?;
            }
            Some(FaultLink::Fexit(link)) => {
                let program = FAULT_FEXIT.0;
                self::program::<FExit>(&mut self.ebpf, program)?
                    .detach(link)
                    .map_err(detach_err(program))?;
            }
            None => {}
        }
        Ok(())
    }

    /// Attaches the fault program again after [`Probes::detach_faults`].
    pub fn attach_faults(&mut self) -> Result<(), ProbeError> {
        if self.fault_link.is_none() {
            self.fault_link = Some(attach_fault(&mut self.ebpf, self.fault_path)?);
        }
        Ok(())
    }

    /// Sums the per-CPU counters. Filtered faults are counted in the per-CPU verdict cache (the
    /// slot the filter already holds) and added here.
    pub fn counters(&self) -> Result<Counters, ProbeError> {
        let mut sums = Counters::default();
        for counter in Counter::all() {
            let per_cpu = self
                .counters
                .get(&(counter as u32), 0)
                .map_err(map_err(hugepage_agent_common::counters::MAP))?;
            sums.0[counter as usize] = per_cpu.iter().sum();
        }
        let verdicts = self
            .verdicts
            .get(&0, 0)
            .map_err(map_err(page_fault_user::VERDICT_CACHE_MAP))?;
        sums.0[Counter::FaultsFiltered as usize] +=
            verdicts.iter().map(|v| v.filtered).sum::<u64>();
        Ok(sums)
    }
}

/// The program `name`, as its concrete type.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, ProbeError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(ProbeError::Missing {
            kind: "program",
            name,
        })?
        .try_into()
        .map_err(load_err(name))
}

/// Loads the fault program where `first` says, or where `fallback` says when the kernel refuses
/// it: the path loaded, and why the first was refused when it was. Nothing is attached yet.
fn load_fault(
    ebpf: &mut Ebpf,
    btf_bytes: &[u8],
    aya_btf: &mut Option<aya::Btf>,
    (first, fallback): (FaultPath, Option<FaultPath>),
) -> Result<(FaultPath, Option<String>), ProbeError> {
    let mut load = |path: FaultPath| -> Result<(), ProbeError> {
        let program = path.program();
        let loaded = match path {
            FaultPath::Tracepoint => self::program::<RawTracePoint>(ebpf, program)?.load(),
            FaultPath::Fentry | FaultPath::Fexit => {
                let btf = parsed(aya_btf, btf_bytes)?;
                let function = FAULT_FENTRY.1;
                if path == FaultPath::Fentry {
                    self::program::<FEntry>(ebpf, program)?.load(function, btf)
                } else {
                    self::program::<FExit>(ebpf, program)?.load(function, btf)
                }
            }
        };
        loaded.map_err(load_err(program))
    };
    match (load(first), fallback) {
        (Ok(()), _) => Ok((first, None)),
        (Err(refused @ ProbeError::ProgramLoad { .. }), Some(fallback)) => {
            load(fallback)?;
            Ok((fallback, Some(refused.to_string())))
        }
        (Err(e), _) => Err(e),
    }
}

/// Why the task iterators would see the agent's own processes alone, when they would: an
/// iterator walks the tasks of its reader's PID namespace, the host's only when the agent's pid
/// is the one the host's `/proc` (under `--host-root`) gives it.
fn own_pid_namespace(host: &HostFs) -> Option<String> {
    let hosts: Option<u32> = host
        .read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_string_lossy().parse().ok());
    (hosts != Some(std::process::id())).then(|| {
        "the agent runs in a PID namespace of its own (a pod without hostPID), and a task \
         iterator sees its reader's namespace alone"
            .to_owned()
    })
}

/// aya's BTF of the kernel, parsed from `bytes` the first time it is asked for.
fn parsed<'b>(slot: &'b mut Option<aya::Btf>, bytes: &[u8]) -> Result<&'b aya::Btf, ProbeError> {
    match slot {
        Some(btf) => Ok(btf),
        empty => Ok(empty.insert(
            aya::Btf::parse(bytes, aya::Endianness::default())
                .map_err(|e| ProbeError::TracingBtf(Box::new(e)))?,
        )),
    }
}

fn attach_fault(ebpf: &mut Ebpf, path: FaultPath) -> Result<FaultLink, ProbeError> {
    match path {
        FaultPath::Tracepoint => {
            let (program, _, tracepoint) = FAULT_PROGRAM;
            self::program::<RawTracePoint>(ebpf, program)?
                .attach(tracepoint)
                .map(FaultLink::Tracepoint)
                .map_err(attach_err(FAULT_PROGRAM))
        }
        FaultPath::Fentry => {
            let (program, function) = FAULT_FENTRY;
            self::program::<FEntry>(ebpf, program)?
                .attach()
                .map(FaultLink::Fentry)
                .map_err(|source| ProbeError::AttachTracing {
                    program,
                    function,
                    source: Box::new(source),
                })
        }
        FaultPath::Fexit => {
            let (program, function) = FAULT_FEXIT;
            self::program::<FExit>(ebpf, program)?
                .attach()
                .map(FaultLink::Fexit)
                .map_err(|source| ProbeError::AttachTracing {
                    program,
                    function,
                    source: Box::new(source),
                })
        }
    }
}

fn load_err(program: &'static str) -> impl Fn(ProgramError) -> ProbeError {
    move |source| ProbeError::ProgramLoad {
        program,
        source: Box::new(source),
    }
}

fn attach_err(
    (program, category, tracepoint): (&'static str, &'static str, &'static str),
) -> impl Fn(ProgramError) -> ProbeError {
    move |source| ProbeError::Attach {
        program,
        category,
        tracepoint,
        source: Box::new(source),
    }
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, ProbeError> {
    ebpf.take_map(name)
        .ok_or(ProbeError::Missing { kind: "map", name })
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> ProbeError {
    move |source| ProbeError::Map {
        name,
        source: Box::new(source),
    }
}

/// The system page size in bytes.
fn base_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests;
