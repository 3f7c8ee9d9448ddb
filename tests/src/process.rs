//! Child processes that cannot outlive the harness, free ports, scratch directories.

use crate::{LabError, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A spawned child process, killed (SIGKILL) and reaped on drop.
///
/// The child is also started with `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills it when the
/// thread that spawned it exits, so it cannot outlive a harness that dies without unwinding.
/// Consequence: spawn from a thread that lives at least as long as the guard (the test's own
/// thread, or `main`).
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr appended to `log_path`.
    pub fn spawn(name: &str, mut cmd: Command, log_path: &Path) -> Result<ChildGuard> {
        let log = File::create(log_path).map_err(|e| {
            LabError(format!(
                "{name}: cannot create log {}: {e}",
                log_path.display()
            ))
        })?;
        let log2 = log.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid) between
        // fork and exec, as `pre_exec` requires.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may already have died between fork and prctl.
                if libc::getppid() == 1 {
                    return Err(std::io::Error::other("parent exited before exec"));
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| LabError(format!("{name}: cannot spawn {cmd:?}: {e}")))?;
        Ok(ChildGuard {
            name: name.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole log (stdout + stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `max_bytes` of the log.
    pub fn log_tail(&self, max_bytes: u64) -> String {
        let Ok(mut f) = File::open(&self.log_path) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// `Some(status)` if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills (SIGKILL) and reaps the child. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// `n` distinct free loopback ports (all listeners held until every port is chosen).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0")?);
    }
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// True if something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Polls `check` every 50 ms until it returns `Ok(true)` or `timeout` passes. `check` may
/// return `Err` to abort (e.g. the process died).
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        if check()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A scratch directory under `<repo>/.lab/` (or `$PREFIX_ROUTER_LAB_DIR`). Removed on drop,
/// except while panicking or when `$PREFIX_ROUTER_LAB_KEEP` is set, so logs survive failures.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn new(label: &str) -> Result<ScratchDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("PREFIX_ROUTER_LAB_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(crate::paths::lab_dir);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("{label}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| LabError(format!("cannot create {}: {e}", path.display())))?;
        Ok(ScratchDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("PREFIX_ROUTER_LAB_KEEP").is_some() {
            eprintln!("lab: keeping logs in {}", self.path.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
