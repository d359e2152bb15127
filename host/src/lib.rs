//! `ipu-host`: the std shell around the no_std crates — devices (the simulator and the PCIe
//! driver), the command line, file formats on disk, and the host reference.

pub mod atomic;
pub mod build;
pub mod device;
pub mod devices;
pub mod fuzz;
pub mod ids;
pub mod inspect;
pub mod lock;
pub mod model;
pub mod npy;
pub mod onnx;
pub mod package;
pub mod params;
pub mod pcie;
pub mod profile;
pub mod program;
pub mod reference;
pub mod search;
pub mod session;
pub mod sim;
pub mod stage_search;
pub mod verdict;

pub use device::{Device, DeviceError, ExchangeFault, RunReport, StopState};
