//! libFuzzer target: `ipu_host::fuzz::onnx` must return for any input.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ipu_host::fuzz::onnx(data);
});
