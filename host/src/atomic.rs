//! Crash-safe file writes: same-directory temporary file, fsync, rename, directory fsync. A reader
//! sees either the old file or the complete new one, never a torn one.

use std::io::Write;
use std::path::Path;

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // The temporary file is created 0600; the result gets the mode a plain create would give it
    // (0666 less the umask), as users expect of output files.
    let mut tmp = tempfile::Builder::new().prefix(".ipu-codegen-").suffix(".tmp").tempfile_in(dir)?;
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o666 & !umask()))?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The process umask, read from `/proc/self/status` (Linux); where that is not readable, it is
/// read by setting and restoring it, which is safe here because no other thread creates files
/// while the binary writes its outputs.
fn umask() -> u32 {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(v) = status.lines().find_map(|l| l.strip_prefix("Umask:")) {
            if let Ok(m) = u32::from_str_radix(v.trim(), 8) {
                return m;
            }
        }
    }
    use nix::sys::stat::{umask, Mode};
    let old = umask(Mode::from_bits_truncate(0o022));
    umask(old);
    old.bits()
}
