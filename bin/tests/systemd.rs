//! The shipped systemd units: `systemd-analyze verify` on each, and the units running under a
//! real systemd booted as PID 1 of a private PID and mount namespace (`unshare`). Inside it
//! /etc, /run, /tmp, /var/lib/systemd and /usr/local/bin are private, so the units are installed
//! exactly as shipped (ExecStart=/usr/local/bin/... is the test's build, /etc/pinring/RING.toml
//! the test's config) and the host is not touched. /dev/shm is shared, so each test uses its own
//! ring name.
//!
//! The tests skip, printing `SKIPPED: <reason>`, when systemd, unshare or nsenter is missing or
//! the namespace cannot be made (not root, no permission); with `PINRING_REQUIRE_SYSTEMD=1` each
//! of those is a failure instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const UNITS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd");
const SYSTEMD: &str = "/lib/systemd/systemd";

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// Set to 1 where these tests must run (CI with systemd installed and root): a skip is then a
/// failure with its reason.
const REQUIRE_SYSTEMD: &str = "PINRING_REQUIRE_SYSTEMD";

/// Every skip of these tests goes through here: prints `SKIPPED: <why>`, or fails with
/// `PINRING_REQUIRE_SYSTEMD=1`.
fn skip(why: &str) {
    pinring_backend::testing::skip_or_fail(REQUIRE_SYSTEMD, why);
}

fn ok(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Copies a template unit to a concrete instance name with ExecStart pointing at our binaries.
fn instance_copy(dir: &Path, template: &str, instance_file: &str) {
    let text = std::fs::read_to_string(Path::new(UNITS).join(template)).unwrap();
    let bin = Path::new(common::DAEMON)
        .parent()
        .unwrap()
        .display()
        .to_string();
    std::fs::write(
        dir.join(instance_file),
        text.replace("/usr/local/bin", &bin),
    )
    .unwrap();
}

#[test]
fn every_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze") else {
        return skip("systemd-analyze not installed (apt-get install systemd)");
    };
    let dir = tempfile::tempdir().unwrap();
    // Templates cannot be verified as such: verify one instance of each. (systemd-analyze 252
    // cannot read a unit file whose name has ':' in it, so the loader instance here has none;
    // the content is the same.)
    instance_copy(
        dir.path(),
        "pinring-daemon@.service",
        "pinring-daemon@gpu0.service",
    );
    instance_copy(
        dir.path(),
        "pinring-loader@.service",
        "pinring-loader@gpu0.service",
    );
    std::fs::copy(
        Path::new(UNITS).join("pinring.target"),
        dir.path().join("pinring.target"),
    )
    .unwrap();
    let mut shipped: Vec<String> = std::fs::read_dir(UNITS)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".service") || n.ends_with(".target"))
        .collect();
    shipped.sort();
    assert_eq!(
        shipped,
        [
            "pinring-daemon@.service",
            "pinring-loader@.service",
            "pinring.target"
        ],
        "a new unit must be added to this test"
    );
    // Every unit points at pinring's own deployment guide, where the documented install puts
    // it (docs/DEPLOY.md installs it there).
    let deploy =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/DEPLOY.md")).unwrap();
    assert!(
        deploy.contains("docs/DEPLOY.md /usr/share/doc/pinring/"),
        "DEPLOY.md installs itself where the units point"
    );
    for unit in &shipped {
        let text = std::fs::read_to_string(Path::new(UNITS).join(unit)).unwrap();
        let docs: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation="))
            .collect();
        assert_eq!(docs, ["file:///usr/share/doc/pinring/DEPLOY.md"], "{unit}");
        if unit.ends_with(".service") {
            assert!(text.lines().any(|l| l == "ProtectHome=read-only"), "{unit}");
        }
    }
    for unit in [
        "pinring-daemon@gpu0.service",
        "pinring-loader@gpu0.service",
        "pinring.target",
    ] {
        let out = Command::new(&analyze)
            .args(["verify", "--man=no"])
            .arg(dir.path().join(unit))
            .output()
            .unwrap();
        let text = ok(&out);
        assert!(
            out.status.success() && text.trim().is_empty(),
            "{unit}:\n{text}"
        );
    }
}

/// A systemd booted in a private namespace; killed (SIGKILL: it ignores SIGTERM) on drop.
struct Booted {
    child: Child,
    pid: u32,
    root: tempfile::TempDir,
}

impl Booted {
    fn boot(tag: &str) -> Option<Booted> {
        for t in [
            "unshare",
            "nsenter",
            "systemctl",
            "systemd-sysusers",
            "timeout",
        ] {
            if tool(t).is_none() {
                skip(&format!("{t} not installed"));
                return None;
            }
        }
        if !Path::new(SYSTEMD).exists() {
            skip(&format!(
                "{SYSTEMD} not installed (apt-get install systemd)"
            ));
            return None;
        }
        if !nix::unistd::Uid::effective().is_root() {
            skip("not root: cannot boot systemd in a namespace");
            return None;
        }
        // Outside /tmp, which is replaced inside the namespace.
        let root = tempfile::Builder::new()
            .prefix(&format!("systemd-{tag}-"))
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let r = root.path();
        let etc = r.join("etc");
        let cp = Command::new("cp")
            .arg("-a")
            .arg("/etc")
            .arg(&etc)
            .status()
            .unwrap();
        assert!(cp.success(), "cannot copy /etc");
        let sys = etc.join("systemd/system");
        std::fs::create_dir_all(&sys).unwrap();
        for f in [
            "pinring-daemon@.service",
            "pinring-loader@.service",
            "pinring.target",
        ] {
            std::fs::copy(Path::new(UNITS).join(f), sys.join(f)).unwrap();
        }
        std::fs::write(
            sys.join("pinring-test-boot.target"),
            "[Unit]\nDescription=pinring test boot\nWants=systemd-journald.socket systemd-journald.service\n",
        )
        .unwrap();
        std::fs::create_dir_all(etc.join("sysusers.d")).unwrap();
        std::fs::copy(
            Path::new(UNITS).join("pinring.sysusers.conf"),
            etc.join("sysusers.d/pinring.conf"),
        )
        .unwrap();
        std::fs::create_dir_all(etc.join("pinring")).unwrap();
        let bin = r.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for b in [common::DAEMON, common::LOADER, common::CLI] {
            let name = Path::new(b).file_name().unwrap();
            std::fs::copy(b, bin.join(name)).unwrap();
        }
        let script = format!(
            "set -e
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /var/lib/systemd && mount -t tmpfs tmpfs /var/lib/systemd
if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi
mount --bind {etc} /etc
mount --bind {bin} /usr/local/bin
systemd-sysusers /etc/sysusers.d/pinring.conf
exec {SYSTEMD} --system --unit=pinring-test-boot.target",
            etc = etc.display(),
            bin = bin.display()
        );
        let child = Command::new("timeout")
            .args([
                "-s",
                "KILL",
                "300",
                "unshare",
                "--pid",
                "--fork",
                "--mount",
                "--mount-proc",
            ])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut booted = Booted {
            child,
            pid: 0,
            root,
        };
        // Find the namespace's PID 1: the grandchild (timeout -> unshare -> systemd).
        let start = Instant::now();
        loop {
            if let Some(pid) = descendant_named(booted.child.id(), "systemd") {
                booted.pid = pid;
                let out = booted.ctl(&["is-system-running"]);
                let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if state == "running" || state == "degraded" {
                    return Some(booted);
                }
            }
            if let Some(st) = booted.child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = booted.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                skip(&format!(
                    "systemd did not boot in a namespace ({st}): {}",
                    err.trim()
                ));
                return None;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "systemd did not boot within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn etc(&self) -> PathBuf {
        self.root.path().join("etc")
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.nsenter("systemctl", args)
    }

    fn nsenter(&self, cmd: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .args([
                "-s",
                "KILL",
                "60",
                "nsenter",
                "-t",
                &self.pid.to_string(),
                "-m",
                "-p",
                cmd,
            ])
            .args(args)
            .output()
            .unwrap()
    }

    /// `pinring consume ARGS` inside the namespace as uid and gid `uid`, a user that is not
    /// pinring, with the supplementary groups `groups` (none: empty), as a trainer runs.
    fn trainer(&self, uid: u32, groups: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args([
            "-s",
            "KILL",
            "120",
            "nsenter",
            "-t",
            &self.pid.to_string(),
            "-m",
            "-p",
        ])
        .args([
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &uid.to_string(),
        ]);
        if groups.is_empty() {
            cmd.arg("--clear-groups");
        } else {
            cmd.args(["--groups", groups]);
        }
        cmd.args(["/usr/local/bin/pinring", "consume"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// The gid of group `name` inside the namespace.
    fn gid(&self, name: &str) -> u32 {
        let out = self.nsenter("getent", &["group", name]);
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        line.split(':')
            .nth(2)
            .and_then(|g| g.trim().parse().ok())
            .unwrap_or_else(|| panic!("no group {name}: {line}"))
    }

    fn prop(&self, unit: &str, prop: &str) -> String {
        let out = self.ctl(&["show", "-p", prop, "--value", unit]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn journal(&self, unit: &str) -> String {
        ok(&self.nsenter("journalctl", &["--no-pager", "-o", "cat", "-u", unit]))
    }

    /// Polls `what` until it returns Some, or fails after `limit`.
    fn until<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        if self.pid != 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process under `parent` (any depth) whose comm is `name`.
fn descendant_named(parent: u32, name: &str) -> Option<u32> {
    let mut frontier = vec![parent];
    while let Some(p) = frontier.pop() {
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).ok()?;
        for c in children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() == name {
                return Some(c);
            }
            frontier.push(c);
        }
    }
    None
}

/// Long enough to run until stopped: 6.4 M batches of 128 KiB.
const ENDLESS: &str = r#"
[ring]
slots = 8
[dataset]
samples = 512
sample_shape = [64, 64]
[plan]
batch_size = 8
epochs = 100000
"#;

/// Removes a ring's segment when a test ends, also when a check failed.
struct RemoveSegment(String);

impl Drop for RemoveSegment {
    fn drop(&mut self) {
        let _ = pinring_ring::Segment::unlink(&self.0);
    }
}

fn delivered(ring: &str) -> u64 {
    pinring_observe::open_read_only(ring, None)
        .map(|r| r.snapshot().header.delivered)
        .unwrap_or(0)
}

#[test]
fn the_units_run_the_pipeline_restart_a_killed_loader_and_drain_on_stop() {
    let Some(sd) = Booted::boot("run") else {
        return;
    };
    let ring = format!("sdrun{}", std::process::id());
    std::fs::write(sd.etc().join(format!("pinring/{ring}.toml")), ENDLESS).unwrap();
    let daemon = format!("pinring-daemon@{ring}.service");
    let l1 = format!("pinring-loader@{ring}:1.service");
    let l2 = format!("pinring-loader@{ring}:2.service");
    let out = sd.ctl(&["enable", &daemon, &l1, &l2]);
    assert!(out.status.success(), "{}", ok(&out));
    // Type=notify: `start` returns once READY=1 arrived (or fails).
    let out = sd.ctl(&["start", "pinring.target"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        ok(&out),
        sd.journal(&daemon)
    );
    assert_eq!(sd.prop(&daemon, "ActiveState"), "active");
    assert!(
        pinring_ring::object_path(&ring).exists(),
        "READY before the ring existed"
    );
    let _cleanup = RemoveSegment(ring.clone());
    // The service hands its batches to a trainer (--sink consumer): one takes them as they come.
    let mut trainer = sd
        .trainer(4242, &sd.gid("pinring").to_string(), &["--ring", &ring])
        .spawn()
        .unwrap();
    // The pipeline runs, and the daemon reports its rate.
    sd.until("batches delivered", Duration::from_secs(30), || {
        (delivered(&ring) > 100).then_some(())
    });
    sd.until("STATUS= with the rate", Duration::from_secs(10), || {
        sd.prop(&daemon, "StatusText")
            .contains("GB/s")
            .then_some(())
    });
    sd.until("both loaders READY", Duration::from_secs(30), || {
        (sd.prop(&l1, "ActiveState") == "active" && sd.prop(&l2, "ActiveState") == "active")
            .then_some(())
    });
    // SIGKILL a loader: systemd restarts it, it rejoins, the run goes on.
    let victim: u32 = sd.prop(&l1, "MainPID").parse().unwrap();
    assert!(victim > 0);
    // MainPID is a pid of the namespace: signal it from inside.
    let out = sd.nsenter("kill", &["-KILL", &victim.to_string()]);
    assert!(out.status.success(), "{}", ok(&out));
    let restarted: u32 = sd.until(
        "the killed loader restarted",
        Duration::from_secs(30),
        || {
            let pid: u32 = sd.prop(&l1, "MainPID").parse().ok()?;
            (pid != 0 && pid != victim && sd.prop(&l1, "ActiveState") == "active").then_some(pid)
        },
    );
    assert_eq!(sd.prop(&l1, "NRestarts"), "1", "{}", sd.journal(&l1));
    let ring_view = pinring_observe::open_read_only(&ring, None).unwrap();
    sd.until(
        "the restarted loader attached and working",
        Duration::from_secs(30),
        || {
            ring_view
                .snapshot()
                .loaders
                .iter()
                // Pids in the table are the namespace's, as systemctl reports them.
                .any(|l| l.pid == restarted && l.batches > 0)
                .then_some(())
        },
    );
    let before = delivered(&ring);
    sd.until("the run continues", Duration::from_secs(30), || {
        (delivered(&ring) > before + 100).then_some(())
    });
    drop(ring_view);
    // Restarting the daemon takes its loaders down and brings them back.
    let old_loader: u32 = sd.prop(&l2, "MainPID").parse().unwrap();
    let out = sd.ctl(&["restart", &daemon]);
    assert!(out.status.success(), "{}", ok(&out));
    sd.until(
        "loaders back after the daemon restart",
        Duration::from_secs(30),
        || {
            let pid: u32 = sd.prop(&l2, "MainPID").parse().ok()?;
            (pid != 0 && pid != old_loader && sd.prop(&l2, "ActiveState") == "active").then_some(())
        },
    );
    // Stop: STOPPING=1, a clean drain, no leftover segment.
    let out = sd.ctl(&["stop", "pinring.target"]);
    assert!(out.status.success(), "{}", ok(&out));
    for u in [&daemon, &l1, &l2] {
        // `stop` returns when the target's job is done; a unit may still be finishing its
        // ExecStopPost.
        let start = Instant::now();
        while !["inactive", "failed"].contains(&sd.prop(u, "ActiveState").as_str()) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{u} did not stop within 30 s:\n{}\n{}",
                ok(&sd.ctl(&["status", "--no-pager", u])),
                ok(&sd.nsenter("journalctl", &["--no-pager", "-n", "60"]))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(sd.prop(u, "Result"), "success", "{u}:\n{}", sd.journal(u));
    }
    let log = sd.journal(&daemon);
    assert!(log.contains("stop requested: draining"), "{log}");
    assert!(
        !pinring_ring::object_path(&ring).exists(),
        "segment left behind"
    );
    let _ = trainer.kill();
    let _ = trainer.wait();
}

/// A token file of `n` u16 tokens under /home (a dataset in a user's home directory), removed
/// at the end of the test.
struct HomeDataset(PathBuf);

impl HomeDataset {
    fn new(tag: &str, n: usize) -> Option<HomeDataset> {
        if !Path::new("/home").is_dir() {
            skip("no /home on this host");
            return None;
        }
        let dir = PathBuf::from(format!("/home/pinring-it-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = HomeDataset(dir);
        let tokens: Vec<u8> = (0..n as u32)
            .flat_map(|t| (t as u16).to_le_bytes())
            .collect();
        std::fs::write(d.0.join("tokens.bin"), tokens).unwrap();
        // Readable by the pinring user, as a dataset shared on a training host is.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(
            d.0.join("tokens.bin"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        Some(d)
    }
}

impl Drop for HomeDataset {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_service_as_shipped_feeds_a_trainer_of_the_pinring_group_from_home_until_stopped() {
    let Some(sd) = Booted::boot("trainer") else {
        return;
    };
    let Some(data) = HomeDataset::new("trainer", 2048) else {
        return;
    };
    let ring = format!("sdtrain{}", std::process::id());
    // One epoch in the file (127 windows of 16 tokens, 16 batches of 8): the service runs
    // every epoch until it is stopped.
    let toml = format!(
        "[ring]\nslots = 8\n[dataset]\nkind = \"tokens\"\n[dataset.tokens]\n\
         files = [\"{}\"]\ntoken_dtype = \"u16\"\nseq_len = 15\nstride = 16\n\
         [plan]\nbatch_size = 8\nepochs = 1\n",
        data.0.join("tokens.bin").display()
    );
    std::fs::write(sd.etc().join(format!("pinring/{ring}.toml")), toml).unwrap();
    let daemon = format!("pinring-daemon@{ring}.service");
    let loader = format!("pinring-loader@{ring}:1.service");
    let out = sd.ctl(&["enable", &daemon, &loader]);
    assert!(out.status.success(), "{}", ok(&out));
    let out = sd.ctl(&["start", "pinring.target"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        ok(&out),
        sd.journal(&daemon)
    );
    let _cleanup = RemoveSegment(ring.clone());
    // The daemon opened the dataset under /home (the target's start succeeds whatever its
    // daemons do).
    assert_eq!(
        sd.prop(&daemon, "ActiveState"),
        "active",
        "{}",
        sd.journal(&daemon)
    );
    // Datasets under /home are read (ProtectHome=read-only), never written.
    for u in [&daemon, &loader] {
        assert_eq!(sd.prop(u, "ProtectHome"), "read-only", "{u}");
    }
    // The ring is the pinring group's, mode 0660: the recipe for a trainer to attach.
    let pinring_gid = sd.gid("pinring");
    let st = nix::sys::stat::stat(&pinring_ring::object_path(&ring)).unwrap();
    assert_eq!(
        (st.st_mode & 0o777, st.st_gid),
        (0o660, pinring_gid),
        "mode and group of the ring"
    );
    // A trainer, a user of group pinring, takes 200 batches: 12.5 epochs of a plan whose file
    // says 1.
    let out = sd
        .trainer(
            4242,
            &pinring_gid.to_string(),
            &["--ring", &ring, "--batches", "200"],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        ok(&out),
        sd.journal(&daemon),
        sd.journal(&loader)
    );
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(v["batches"].as_u64(), Some(200), "{line}");
    assert_eq!(sd.prop(&daemon, "ActiveState"), "active", "still serving");
    // A user outside the group is refused, told why and what to do.
    let out = sd
        .trainer(4243, "", &["--ring", &ring, "--timeout-secs", "5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&ring) && err.contains("permission denied for uid 4243"),
        "{err}"
    );
    let out = sd.ctl(&["stop", "pinring.target"]);
    assert!(out.status.success(), "{}", ok(&out));
    sd.until("the daemon stopped", Duration::from_secs(30), || {
        (sd.prop(&daemon, "ActiveState") == "inactive").then_some(())
    });
    assert_eq!(
        sd.prop(&daemon, "Result"),
        "success",
        "{}",
        sd.journal(&daemon)
    );
}

#[test]
fn a_wrong_config_fails_the_daemon_unit_with_the_message_in_the_journal() {
    let Some(sd) = Booted::boot("bad") else {
        return;
    };
    let ring = format!("sdbad{}", std::process::id());
    std::fs::write(
        sd.etc().join(format!("pinring/{ring}.toml")),
        "[ring]\nslots = 1\n",
    )
    .unwrap();
    let daemon = format!("pinring-daemon@{ring}.service");
    let out = sd.ctl(&["start", &daemon]);
    assert!(!out.status.success(), "a bad config must fail the start");
    // `start` may return before the unit's state has settled (seen once in a release run on
    // two busy cores: "activating" right after the failed start): wait for it to leave the
    // transitional states, then it must be "failed".
    let state = sd.until("the daemon unit to settle", Duration::from_secs(30), || {
        let s = sd.prop(&daemon, "ActiveState");
        (!["activating", "deactivating", "reloading"].contains(&s.as_str())).then_some(s)
    });
    assert_eq!(state, "failed", "{}", ok(&out));
    assert_eq!(
        sd.prop(&daemon, "ExecMainStatus"),
        "3",
        "exit code 3 = config"
    );
    // RestartPreventExitStatus: a bad config is not retried.
    assert_eq!(sd.prop(&daemon, "NRestarts"), "0");
    let log = sd.journal(&daemon);
    assert!(
        log.contains(&format!("/etc/pinring/{ring}.toml")) && log.contains("ring.slots"),
        "the journal names the file and the key:\n{log}"
    );
    assert!(!pinring_ring::object_path(&ring).exists());
}

#[test]
fn the_deploy_guides_drop_in_hides_home_but_the_datasets_directory() {
    let Some(sd) = Booted::boot("dropin") else {
        return;
    };
    let Some(data) = HomeDataset::new("dropin", 2048) else {
        return;
    };
    let ring = format!("sddropin{}", std::process::id());
    let toml = format!(
        "[ring]\nslots = 8\n[dataset]\nkind = \"tokens\"\n[dataset.tokens]\n\
         files = [\"{}\"]\ntoken_dtype = \"u16\"\nseq_len = 15\nstride = 16\n",
        data.0.join("tokens.bin").display()
    );
    std::fs::write(sd.etc().join(format!("pinring/{ring}.toml")), toml).unwrap();
    let daemon = format!("pinring-daemon@{ring}.service");
    let loader = format!("pinring-loader@{ring}:1.service");
    // The drop-in docs/DEPLOY.md gives for a host that keeps /home hidden.
    let drop_in = format!(
        "[Service]\nProtectHome=tmpfs\nBindReadOnlyPaths={}\n",
        data.0.display()
    );
    for u in [&daemon, &loader] {
        let dir = sd.etc().join(format!("systemd/system/{u}.d"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("home.conf"), &drop_in).unwrap();
    }
    let deploy =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/DEPLOY.md")).unwrap();
    assert!(
        deploy.contains("ProtectHome=tmpfs\nBindReadOnlyPaths="),
        "the guide gives this drop-in"
    );
    let out = sd.ctl(&["daemon-reload"]);
    assert!(out.status.success(), "{}", ok(&out));
    let out = sd.ctl(&["start", &daemon, &loader]);
    assert!(
        out.status.success(),
        "{}\n{}",
        ok(&out),
        sd.journal(&daemon)
    );
    let _cleanup = RemoveSegment(ring.clone());
    for u in [&daemon, &loader] {
        assert_eq!(sd.prop(u, "ProtectHome"), "tmpfs", "{u}");
    }
    let out = sd
        .trainer(
            4242,
            &sd.gid("pinring").to_string(),
            &["--ring", &ring, "--batches", "20"],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        ok(&out),
        sd.journal(&daemon),
        sd.journal(&loader)
    );
    // The rest of /home is hidden from the units: a unit of the same settings sees only the
    // dataset's directory there.
    let look = "pinring-test-home.service";
    std::fs::write(
        sd.etc().join(format!("systemd/system/{look}")),
        format!(
            "[Service]\nType=oneshot\nUser=pinring\nExecStart=/bin/ls -A /home\n{}",
            drop_in.trim_start_matches("[Service]\n")
        ),
    )
    .unwrap();
    let out = sd.ctl(&["daemon-reload"]);
    assert!(out.status.success(), "{}", ok(&out));
    let out = sd.ctl(&["start", look]);
    assert!(out.status.success(), "{}\n{}", ok(&out), sd.journal(look));
    // What ls printed, once the journal has it.
    let seen = sd.until(
        "ls's output in the journal",
        Duration::from_secs(10),
        || {
            let out = sd.nsenter(
                "journalctl",
                &["--no-pager", "-o", "cat", "-u", look, "_COMM=ls"],
            );
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            (!text.trim().is_empty()).then_some(text)
        },
    );
    assert_eq!(
        seen.split_whitespace().collect::<Vec<_>>(),
        [data.0.file_name().unwrap().to_str().unwrap()],
        "{}",
        sd.journal(look)
    );
    let out = sd.ctl(&["stop", &daemon]);
    assert!(out.status.success(), "{}", ok(&out));
}
