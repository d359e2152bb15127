//! Crash safety and device ownership, with real processes and SIGKILL.

use ipu_host::package::Package;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipu-codegen"));
    c.env("RUST_LOG", "info");
    c
}

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.toml"))
}

/// SIGKILL the child; true if it was still running (the kill interrupted it).
fn kill(child: &mut std::process::Child) -> bool {
    if let Ok(Some(_)) = child.try_wait() {
        return false;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let status = child.wait().unwrap();
    std::os::unix::process::ExitStatusExt::signal(&status) == Some(9)
}

#[test]
fn killed_writers_never_leave_a_torn_package() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.ipuexe");
    // Calibrate the kill window to the time a build takes on this machine.
    let t0 = Instant::now();
    assert!(bin()
        .arg("build")
        .arg(example("matmul"))
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success());
    let window = (t0.elapsed().as_micros() as u64).max(1000);
    std::fs::remove_file(&out).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut seen_valid = 0;
    let mut interrupted = 0;
    let mut attempts = 0;
    while interrupted < 100 && attempts < 400 {
        let i = attempts;
        attempts += 1;
        // Alternate two models so the file at the final path changes between writes.
        let model = if i % 2 == 0 { example("matmul") } else { example("attention") };
        let mut child = bin()
            .arg("build")
            .arg(&model)
            .arg("-o")
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        std::thread::sleep(Duration::from_micros(state % window));
        interrupted += usize::from(kill(&mut child));
        if out.exists() {
            let bytes = std::fs::read(&out).unwrap();
            Package::from_bytes(&bytes)
                .unwrap_or_else(|e| panic!("kill {i}: torn package at the final path: {e}"));
            seen_valid += 1;
        }
    }
    println!(
        "{attempts} writers killed at random points ({interrupted} while still running); the final path held a \
         complete package {seen_valid} times and nothing otherwise"
    );
    assert!(interrupted >= 100, "only {interrupted} of {attempts} kills hit a running writer");
}

#[test]
fn the_lock_says_who_holds_it_and_is_released_when_the_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("m.ipuexe");
    assert!(bin()
        .arg("build")
        .arg(example("matmul"))
        .arg("-o")
        .arg(&pkg)
        .args(["--tiles", "64"])
        .status()
        .unwrap()
        .success());
    let locks = dir.path().join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    let run = |extra: &[&str]| {
        let mut c = bin();
        c.env("IPU_CODEGEN_LOCK_DIR", &locks).arg("run").arg(&pkg).args(["--device", "sim"]).args(extra);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        c
    };
    // A long-running holder.
    let mut holder = run(&["--iterations", "100000"]).spawn().unwrap();
    let lock_file = locks.join("ipu-codegen-sim.lock");
    let start = Instant::now();
    while !std::fs::read_to_string(&lock_file).unwrap_or_default().contains(&format!("pid {}", holder.id())) {
        assert!(start.elapsed() < Duration::from_secs(30), "holder never took the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    // --no-wait: distinct exit code, names the holder.
    let busy = run(&["--no-wait"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(3));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(err.contains(&format!("held by pid {}", holder.id())), "{err}");
    // A waiter gets the device once the holder is killed.
    let waiter = run(&[]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    kill(&mut holder);
    let out = waiter.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(
        log.contains("waiting for hardware ownership") && log.contains("acquired hardware ownership"),
        "{log}"
    );
    println!("lock: --no-wait exited 3 naming pid {}; the waiter acquired after SIGKILL", holder.id());
}
