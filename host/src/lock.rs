//! Hardware ownership: an exclusive `flock` on a lock file per device. The kernel releases it
//! when the holder exits or dies, so a crashed run never leaves the device locked.

use nix::fcntl::{Flock, FlockArg};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use tracing::info;

/// A held lock (released on drop).
pub struct DeviceLock {
    _lock: Flock<File>,
    /// Lock file.
    pub path: PathBuf,
}

/// The lock file for a device name (`sim`, `/dev/ipu0`): in `$IPU_CODEGEN_LOCK_DIR`, else the
/// system temporary directory.
pub fn lock_path(device: &str) -> PathBuf {
    let dir = std::env::var_os("IPU_CODEGEN_LOCK_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let name: String = device.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    dir.join(format!("ipu-codegen-{}.lock", name.trim_matches('_')))
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file cannot be opened.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// Held by another process and `wait` was false.
    #[error("device is in use: {path} is held by {holder}")]
    Busy {
        /// Lock file.
        path: String,
        /// Who holds it.
        holder: String,
    },
}

fn holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut s));
    let s = s.trim();
    if s.is_empty() {
        "another process".into()
    } else {
        s.into()
    }
}

/// Take the lock, waiting (with a message) if `wait`, else failing with [`LockError::Busy`].
pub fn acquire(path: &Path, wait: bool) -> Result<DeviceLock, LockError> {
    let io = |e| LockError::Io(path.display().to_string(), e);
    let open = || OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
    let file = open().map_err(io)?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, _)) => {
            let who = holder(&mut file);
            if !wait {
                return Err(LockError::Busy { path: path.display().to_string(), holder: who });
            }
            info!(path = %path.display(), holder = %who, "waiting for hardware ownership");
            Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io(std::io::Error::from(e)))?
        }
    };
    let me = format!("pid {} ({})", std::process::id(), std::env::args().next().unwrap_or_default());
    let _ = lock.set_len(0).and_then(|_| lock.rewind()).and_then(|_| lock.write_all(me.as_bytes()));
    info!(path = %path.display(), "acquired hardware ownership");
    Ok(DeviceLock { _lock: lock, path: path.to_path_buf() })
}
