//! How a ring's size compares with the host: the last-level CPU cache and the available memory.
//! Neither is an error (a ring larger than the cache works, only slower; the memory is reserved
//! up front and a ring that does not fit fails at start with exit 4), so `pinring config check`
//! and the daemon at start print warnings.
//!
//! The cache size also sizes an automatic ring ([`pinring_data::Spec::resolve`] with [`HostMemory::cache_bytes`]): the daemon (and
//! `pinring config check`, to show it) resolves `ring.slot_bytes = "auto"` once, here, and
//! publishes the result in the ring header; loaders never read the cache, they adopt the ring's
//! slot size ([`pinring_data::Config::adopt_slot_bytes`]).

use pinring_data::{ByteSize, HostFacts};
use std::path::Path;

/// Where Linux describes CPU 0's caches.
pub const CACHE_DIR: &str = "/sys/devices/system/cpu/cpu0/cache";
/// Where Linux says how much memory is available.
pub const MEMINFO: &str = "/proc/meminfo";
/// Environment variable that sets the last-level cache size (`300MiB`, `314572800`) instead of
/// [`CACHE_DIR`]: for hosts whose sysfs hides it, and for tests. A value that does not parse is
/// ignored.
pub const ENV_LLC_BYTES: &str = "PINRING_LLC_BYTES";

/// A CPU cache level and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cache {
    /// Level (3 for L3).
    pub level: u32,
    /// Size in bytes.
    pub bytes: u64,
}

/// The host's last-level cache and available memory, each `None` when it could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostMemory {
    /// The highest-level data or unified cache of CPU 0.
    pub last_level_cache: Option<Cache>,
    /// `MemAvailable` of /proc/meminfo, bytes.
    pub available: Option<u64>,
    /// The cache size came from [`ENV_LLC_BYTES`] (its level is then 0: unknown).
    pub cache_from_env: bool,
}

impl HostMemory {
    /// Reads this host's values ([`CACHE_DIR`], [`MEMINFO`]).
    /// [`ENV_LLC_BYTES`], when set to a size, replaces the cache size.
    pub fn read() -> HostMemory {
        let host = HostMemory::read_from(Path::new(CACHE_DIR), Path::new(MEMINFO));
        let env = std::env::var(ENV_LLC_BYTES).ok();
        host.with_cache_override(env.as_deref())
    }

    /// This host with the cache size `text` (a size, as [`ENV_LLC_BYTES`] takes it) instead of
    /// the one read; `None`, an empty or unparsable text, or 0 keep the one read.
    pub fn with_cache_override(mut self, text: Option<&str>) -> HostMemory {
        let bytes = text
            .and_then(|t| t.parse::<ByteSize>().ok())
            .map(|b| b.0)
            .filter(|&b| b > 0);
        if let Some(bytes) = bytes {
            self.last_level_cache = Some(Cache { level: 0, bytes });
            self.cache_from_env = true;
        }
        self
    }

    /// The last-level cache's size, what `"auto"` sizes a ring from (`None`: unknown).
    pub fn cache_bytes(&self) -> Option<u64> {
        self.last_level_cache.map(|c| c.bytes)
    }

    /// What the resolver and the ring's warnings need to know of this host
    /// ([`pinring_data::Config::ring_warnings`]).
    pub fn facts(&self) -> HostFacts {
        HostFacts {
            cache_bytes: self.cache_bytes(),
            cache_level: self.last_level_cache.map_or(0, |c| c.level),
            available: self.available,
            // A GPU's decoder is the backend's to probe: the daemon sets it where it resolves.
            gpu_decode: false,
        }
    }

    /// Where the cache size given to `"auto"` ([`HostMemory::cache_bytes`]) came from, in words.
    pub fn cache_origin(&self) -> String {
        match self.last_level_cache {
            Some(c) if self.cache_from_env => {
                format!(
                    "half the last-level cache of {} from ${ENV_LLC_BYTES}, at most 128 MiB",
                    ByteSize(c.bytes)
                )
            }
            Some(c) => format!(
                "half the last-level cache (L{}, {}, from {CACHE_DIR}), at most 128 MiB",
                c.level,
                ByteSize(c.bytes)
            ),
            None => format!(
                "the fallback for an unknown last-level cache (nothing readable in {CACHE_DIR}, \
                 ${ENV_LLC_BYTES} unset)"
            ),
        }
    }

    /// Reads the values from a cache directory laid out like [`CACHE_DIR`] (`index*/level`,
    /// `index*/type`, `index*/size`) and a file like [`MEMINFO`].
    pub fn read_from(cache_dir: &Path, meminfo: &Path) -> HostMemory {
        HostMemory {
            last_level_cache: last_level_cache(cache_dir),
            available: std::fs::read_to_string(meminfo)
                .ok()
                .and_then(|t| mem_available(&t)),
            cache_from_env: false,
        }
    }

    /// One line for reports: `last-level cache L3 32.0 MiB; available memory 22.6 GiB`, with
    /// `unknown` for what could not be read.
    pub fn describe(&self) -> String {
        let cache = match self.last_level_cache {
            Some(c) if self.cache_from_env => {
                format!("{} (from ${ENV_LLC_BYTES})", ByteSize(c.bytes))
            }
            Some(c) => format!("L{} {}", c.level, ByteSize(c.bytes)),
            None => format!("unknown (nothing readable in {CACHE_DIR})"),
        };
        let mem = match self.available {
            Some(b) => ByteSize(b).to_string(),
            None => format!("unknown (no MemAvailable in {MEMINFO})"),
        };
        format!("last-level cache {cache}; available memory {mem}")
    }
}

/// The highest-level data or unified cache listed in `dir` (`index*/{level,type,size}`).
fn last_level_cache(dir: &Path) -> Option<Cache> {
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).ok();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| {
            let p = e.path();
            if read(&p, "type").is_some_and(|t| t.trim() == "Instruction") {
                return None;
            }
            Some(Cache {
                level: read(&p, "level")?.trim().parse().ok()?,
                bytes: cache_size(&read(&p, "size")?)?,
            })
        })
        .max_by_key(|c| (c.level, c.bytes))
}

/// A sysfs cache size: `32768K`, `8M`, `1G` or plain bytes.
fn cache_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, scale) = match t.chars().last()? {
        'K' | 'k' => (&t[..t.len() - 1], 1u64 << 10),
        'M' | 'm' => (&t[..t.len() - 1], 1 << 20),
        'G' | 'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(scale)
        .filter(|&b| b > 0)
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_host(caches: &[(&str, &str, &str)], meminfo: &str) -> (tempfile::TempDir, HostMemory) {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        for (i, (level, kind, size)) in caches.iter().enumerate() {
            let d = cache.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        std::fs::write(dir.path().join("meminfo"), meminfo).unwrap();
        let host = HostMemory::read_from(&cache, &dir.path().join("meminfo"));
        (dir, host)
    }

    const MEMINFO_8G: &str =
        "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8388608 kB\n";

    #[test]
    fn reads_the_highest_level_cache_and_mem_available() {
        let (_d, host) = fake_host(
            &[
                ("1", "Data", "32K"),
                ("1", "Instruction", "32K"),
                ("2", "Unified", "1024K"),
                ("3", "Unified", "32768K"),
            ],
            MEMINFO_8G,
        );
        assert_eq!(
            host.last_level_cache,
            Some(Cache {
                level: 3,
                bytes: 32 << 20
            })
        );
        assert_eq!(host.available, Some(8 << 30));
        // Without L3 the highest level present is the last level.
        let (_d, host) = fake_host(&[("1", "Data", "48K"), ("2", "Unified", "2M")], "");
        assert_eq!(
            host.last_level_cache,
            Some(Cache {
                level: 2,
                bytes: 2 << 20
            })
        );
        assert_eq!(host.available, None);
    }

    #[test]
    fn warns_for_a_ring_over_the_cache_or_the_memory_and_only_then() {
        let (_d, host) = fake_host(&[("3", "Unified", "32768K")], MEMINFO_8G);
        assert!(pinring_data::ring_warnings("r", 8, 1 << 20, &host.facts()).is_empty());
        let w = pinring_data::ring_warnings("r", 64, 1 << 20, &host.facts());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("\"r\"") && w[0].contains("last-level cache (L3, 32.0 MiB)"),
            "{w:?}"
        );
        assert!(w[0].contains("64 slots x 1.0 MiB = 64.0 MiB"), "{w:?}");
        let w = pinring_data::ring_warnings("r", 16, 1 << 30, &host.facts());
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[1].contains("available memory (MemAvailable 8.0 GiB)") && w[1].contains("fewer"),
            "{w:?}"
        );
    }

    #[test]
    fn an_unknown_size_gives_no_warning_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostMemory::read_from(&dir.path().join("none"), &dir.path().join("none"));
        assert_eq!(host, HostMemory::default());
        assert!(pinring_data::ring_warnings("r", 4096, 1 << 30, &host.facts()).is_empty());
        let d = host.describe();
        assert!(
            d.contains("last-level cache unknown") && d.contains("available memory unknown"),
            "{d}"
        );
    }

    #[test]
    fn parses_sysfs_sizes() {
        assert_eq!(cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(cache_size("8M"), Some(8 << 20));
        assert_eq!(cache_size("1G"), Some(1 << 30));
        assert_eq!(cache_size("4096"), Some(4096));
        assert_eq!(cache_size(""), None);
        assert_eq!(cache_size("0K"), None);
        assert_eq!(cache_size("lots"), None);
        assert_eq!(mem_available("MemAvailable: 12 kB\n"), Some(12 << 10));
        assert_eq!(mem_available("MemFree: 12 kB\n"), None);
    }
}
