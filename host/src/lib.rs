//! `ipu-host`: the std shell around the no_std crates — devices (the simulator and the PCIe
//! driver), the command line, file formats on disk, and the host reference.

pub mod device;
pub mod program;
pub mod sim;

pub use device::{Device, DeviceError, ExchangeFault, RunReport, StopState};
