//! NUMA placement: a ring's memory and the threads that fill and drain it on the NUMA node of
//! the GPU it feeds.
//!
//! The GPU's node is sysfs's (`/sys/bus/pci/devices/<bus id>/numa_node`, the bus id from the
//! driver: `pinring_backend::Backend::pci_bus_id`), its CPUs the node's `cpulist`. The daemon
//! pins its own thread there before it starts the others (they inherit it), and makes the ring
//! with that node preferred for its pages (`set_mempolicy(MPOL_PREFERRED)` while the segment is
//! created and prefaulted, then back to the default). Loaders follow their daemon: each takes
//! the daemon's CPUs when they are narrower than its own ([`follow`]). `daemon.cpus` and
//! `daemon.loader_cpus` override both. On a host of one node there is nothing to place, and the
//! daemon says so once.

use serde::Serialize;
use std::path::Path;

/// Where a daemon runs its threads and keeps its ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The NUMA node the ring's pages are preferred on (`None`: the kernel's default).
    pub node: Option<u32>,
    /// The CPUs the daemon's threads are pinned to (empty: not pinned).
    pub cpus: Vec<usize>,
    /// What was decided and why, for the log and `pinring config check`.
    pub note: String,
}

/// `"0-3,8,10-11"` (a sysfs cpulist or nodelist) as its numbers; `None` if malformed.
pub fn parse_list(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let num = |t: &str| t.trim().parse::<usize>().ok();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if hi < lo {
            return None;
        }
        out.extend(lo..=hi);
    }
    Some(out)
}

/// A config's CPU list (`daemon.cpus`, `daemon.loader_cpus`) as CPU numbers.
pub fn cpus(list: Option<&Vec<u32>>) -> Option<Vec<usize>> {
    list.map(|c| c.iter().map(|&x| x as usize).collect())
}

/// A list as a sysfs cpulist writes it (`0-3,8`).
pub fn format_list(items: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let start = items[i];
        while i + 1 < items.len() && items[i + 1] == items[i] + 1 {
            i += 1;
        }
        out.push(if items[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", items[i])
        });
        i += 1;
    }
    out.join(",")
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The online NUMA nodes under sysfs root `sys` (empty without NUMA support: one node).
pub fn online_nodes(sys: &Path) -> Vec<usize> {
    read(&sys.join("devices/system/node/online"))
        .and_then(|t| parse_list(&t))
        .unwrap_or_default()
}

/// The NUMA node of PCI device `bus_id` (`None`: the firmware gives none, `-1`).
pub fn device_node(sys: &Path, bus_id: &str) -> Option<u32> {
    let text = read(
        &sys.join("bus/pci/devices")
            .join(bus_id.to_ascii_lowercase())
            .join("numa_node"),
    )?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The CPUs of NUMA node `node`.
pub fn node_cpus(sys: &Path, node: u32) -> Vec<usize> {
    read(&sys.join(format!("devices/system/node/node{node}/cpulist")))
        .and_then(|t| parse_list(&t))
        .unwrap_or_default()
}

/// The placement of a daemon whose device is `bus_id` (`None`: the host backend), with
/// `daemon.cpus` as `cpus_override`; `sys` is the sysfs root (`/sys`).
pub fn plan(sys: &Path, bus_id: Option<&str>, cpus_override: Option<&[usize]>) -> Placement {
    let nodes = online_nodes(sys);
    let node = bus_id.and_then(|b| device_node(sys, b));
    if let Some(cpus) = cpus_override {
        return Placement {
            node: node.filter(|_| nodes.len() > 1),
            cpus: cpus.to_vec(),
            note: format!("daemon threads on CPUs {} (daemon.cpus)", format_list(cpus)),
        };
    }
    if nodes.len() <= 1 {
        return Placement {
            node: None,
            cpus: Vec::new(),
            note: "one NUMA node on this host: nothing to place".into(),
        };
    }
    let Some(bus) = bus_id else {
        return Placement {
            node: None,
            cpus: Vec::new(),
            note: format!(
                "{} NUMA nodes, no GPU (host backend): nothing to place",
                nodes.len()
            ),
        };
    };
    let Some(n) = node else {
        return Placement {
            node: None,
            cpus: Vec::new(),
            note: format!(
                "{} NUMA nodes, but GPU {bus} reports none (numa_node -1): not placed; set \
                 daemon.cpus to place it",
                nodes.len()
            ),
        };
    };
    let cpus = node_cpus(sys, n);
    Placement {
        node: Some(n),
        note: format!(
            "GPU {bus} on NUMA node {n} of {}: ring memory on node {n}, daemon threads on CPUs {}",
            nodes.len(),
            format_list(&cpus)
        ),
        cpus,
    }
}

/// Pins the calling thread (and the threads it starts later) to `cpus`.
pub fn pin_this_thread(cpus: &[usize]) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// The CPUs process (or thread) `pid` may run on.
pub fn cpus_of(pid: i32) -> nix::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(pid))?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// A loader's CPUs: `loader_cpus` if the config names them, else its daemon's (process
/// `daemon_pid`) where those are fewer than its own, else none to change. Returns the CPUs it
/// pinned itself to, if any.
pub fn follow(daemon_pid: i32, loader_cpus: Option<&[usize]>) -> nix::Result<Option<Vec<usize>>> {
    let want = match loader_cpus {
        Some(c) => c.to_vec(),
        None => {
            let theirs = cpus_of(daemon_pid)?;
            let mine = cpus_of(0)?;
            if theirs.is_empty() || theirs.len() >= mine.len() {
                return Ok(None);
            }
            theirs
        }
    };
    pin_this_thread(&want)?;
    Ok(Some(want))
}

/// While alive, this thread's new pages are preferred on one node (`set_mempolicy`); back to
/// the default policy on drop.
#[derive(Debug)]
pub struct PreferNode(bool);

const MPOL_DEFAULT: i32 = 0;
const MPOL_PREFERRED: i32 = 1;

/// Prefers `node` for the calling thread's new pages until the guard drops (`None`: nothing
/// changes).
pub fn prefer_node(node: Option<u32>) -> std::io::Result<PreferNode> {
    let Some(node) = node else {
        return Ok(PreferNode(false));
    };
    let bits = 8 * std::mem::size_of::<u64>();
    let mut mask = vec![0u64; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    set_mempolicy(MPOL_PREFERRED, Some(&mask))?;
    Ok(PreferNode(true))
}

impl Drop for PreferNode {
    fn drop(&mut self) {
        if self.0 {
            let _ = set_mempolicy(MPOL_DEFAULT, None);
        }
    }
}

fn set_mempolicy(mode: i32, mask: Option<&[u64]>) -> std::io::Result<()> {
    let (ptr, bits) = match mask {
        Some(m) => (m.as_ptr(), (m.len() * 64 + 1) as u64),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: set_mempolicy(2) reads `bits - 1` bits from `ptr`, which points at `mask`'s
    // `len * 64` bits (alive for the call), or nothing with a null mask and MPOL_DEFAULT; it
    // changes only this thread's allocation policy.
    let r = unsafe { nix::libc::syscall(nix::libc::SYS_set_mempolicy, mode, ptr, bits) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sys(nodes: &str, gpu_node: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let node = d.path().join("devices/system/node");
        std::fs::create_dir_all(node.join("node0")).unwrap();
        std::fs::create_dir_all(node.join("node1")).unwrap();
        std::fs::write(node.join("online"), nodes).unwrap();
        std::fs::write(node.join("node0/cpulist"), "0-7,16-23\n").unwrap();
        std::fs::write(node.join("node1/cpulist"), "8-15,24-31\n").unwrap();
        let pci = d.path().join("bus/pci/devices/0000:9a:00.0");
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("numa_node"), gpu_node).unwrap();
        d
    }

    #[test]
    fn lists_read_and_write_as_sysfs_has_them() {
        assert_eq!(
            parse_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_list("0"), Some(vec![0]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("x"), None);
        assert_eq!(format_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    }

    #[test]
    fn a_gpu_on_node_1_of_2_places_the_ring_and_threads_there() {
        let sys = fake_sys("0-1\n", "1\n");
        let p = plan(sys.path(), Some("0000:9A:00.0"), None);
        assert_eq!(p.node, Some(1));
        assert_eq!(p.cpus, (8..=15).chain(24..=31).collect::<Vec<_>>());
        assert!(
            p.note.contains("node 1 of 2") && p.note.contains("8-15,24-31"),
            "{}",
            p.note
        );
        // daemon.cpus wins for the threads; the memory still follows the GPU.
        let p = plan(sys.path(), Some("0000:9a:00.0"), Some(&[2, 3]));
        assert_eq!((p.node, p.cpus), (Some(1), vec![2, 3]));
    }

    #[test]
    fn one_node_no_gpu_or_no_node_places_nothing_and_says_why() {
        let p = plan(fake_sys("0\n", "0\n").path(), Some("0000:9a:00.0"), None);
        assert_eq!((p.node, p.cpus.len()), (None, 0));
        assert!(p.note.contains("one NUMA node"), "{}", p.note);
        let p = plan(fake_sys("0-1\n", "0\n").path(), None, None);
        assert!(
            p.node.is_none() && p.note.contains("host backend"),
            "{}",
            p.note
        );
        let p = plan(fake_sys("0-1\n", "-1\n").path(), Some("0000:9a:00.0"), None);
        assert!(
            p.node.is_none() && p.note.contains("reports none"),
            "{}",
            p.note
        );
        // No NUMA support in the kernel: no node directory at all.
        let empty = tempfile::tempdir().unwrap();
        assert!(plan(empty.path(), Some("0000:9a:00.0"), None)
            .note
            .contains("one NUMA node"));
    }

    #[test]
    fn the_memory_policy_and_the_thread_pinning_take_effect_on_this_host() {
        // Node 0 exists everywhere; the policy is this thread's and is reset by the guard.
        let guard = prefer_node(Some(0)).unwrap();
        drop(guard);
        std::thread::spawn(|| {
            let all = cpus_of(0).unwrap();
            pin_this_thread(&all[..1]).unwrap();
            assert_eq!(cpus_of(0).unwrap(), all[..1].to_vec());
            // A loader follows a daemon pinned narrower than itself; not a wider one.
            let me = nix::unistd::gettid().as_raw();
            assert_eq!(
                follow(me, None).unwrap(),
                None,
                "same CPUs: nothing to change"
            );
        })
        .join()
        .unwrap();
    }
}
