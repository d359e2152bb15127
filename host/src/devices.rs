//! Choosing a device: `auto` (hardware when `/dev/ipu0` exists, else the simulator), `sim`, or a
//! device path.

use crate::device::{Device, DeviceError};
use crate::pcie::PcieDevice;
use crate::sim::{SimConfig, SimDevice};
use std::path::Path;
use tracing::info;

/// Open the device named by `spec`; returns it and its name for the lock.
pub fn open_device(
    spec: &str,
    tiles: usize,
    threads: usize,
    max_cycles: u64,
) -> Result<(Box<dyn Device>, String), DeviceError> {
    let sim = || -> Result<(Box<dyn Device>, String), DeviceError> {
        let d = SimDevice::new(SimConfig { tiles, threads, max_cycles })?;
        Ok((Box::new(d), "sim".to_string()))
    };
    match spec {
        "sim" => {
            info!(device = "sim", tiles, "opening simulated IPU device");
            sim()
        }
        "auto" => {
            if Path::new("/dev/ipu0").exists() {
                info!(path = "/dev/ipu0", "opening IPU device (auto: hardware present)");
                Ok((Box::new(PcieDevice::open(Path::new("/dev/ipu0"))?), "/dev/ipu0".into()))
            } else {
                info!(device = "sim", tiles, "opening simulated IPU device (auto: no /dev/ipu0)");
                sim()
            }
        }
        path if path.starts_with("/dev/") => {
            info!(path, "opening IPU device");
            Ok((Box::new(PcieDevice::open(Path::new(path))?), path.to_string()))
        }
        other => Err(DeviceError::Request(format!("unknown device `{other}`: use auto, sim or /dev/ipuN"))),
    }
}
