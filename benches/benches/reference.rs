//! Host reference speed: the device-precision matmul (blocked and vectorised, bit-identical to the
//! element-by-element specification) and the whole reference (device precision + f64 values and
//! bounds) on the full-chip GEMM 2048×1024·1024×2048, in G MAC/s, on 1 and 2 threads; the
//! specification on a slice of the same rows for the speed-up. `cargo bench --bench reference`.

use ipu_host::reference::{evaluate, matmul_device, matmul_device_scalar, HostTensor, MatMulArgs};
use ipu_schema::DType;
use std::collections::BTreeMap;
use std::time::Instant;

fn tensor(shape: [u64; 2], seed: u64) -> HostTensor {
    let n = shape[0] * shape[1];
    let mut z = seed;
    let data = (0..n)
        .map(|_| {
            z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            half::f16::from_f32((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).to_f32()
        })
        .collect();
    HostTensor { dtype: DType::F16, shape: shape.to_vec(), data }
}

fn main() {
    let (m, k, n) = (2048u64, 1024u64, 2048u64);
    let (a, b) = (tensor([m, k], 1), tensor([k, n], 2));
    let macs = (m * k * n) as f64;
    for acc in [DType::F16, DType::F32] {
        let args = MatMulArgs {
            a: &a,
            b: &b,
            ta: false,
            tb: false,
            acc,
            tk: 1,
            rounds: vec![],
            iscl: 0,
            alpha: None,
        };
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let t = Instant::now();
            let (c, _) = pool.install(|| matmul_device(&args));
            let s = t.elapsed().as_secs_f64();
            println!(
                "reference matmul_device acc={} threads={threads} {:.2} s {:.2} GMAC/s checksum={:.3}",
                acc.name(),
                s,
                macs / s / 1e9,
                c.iter().map(|v| *v as f64).sum::<f64>()
            );
        }
    }
    // The specification on 16 rows, for the ratio.
    let a16 = HostTensor { shape: vec![16, k], data: a.data[..(16 * k) as usize].to_vec(), ..a.clone() };
    let args = MatMulArgs {
        a: &a16,
        b: &b,
        ta: false,
        tb: false,
        acc: DType::F32,
        tk: 1,
        rounds: vec![],
        iscl: 0,
        alpha: None,
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let t = Instant::now();
    pool.install(|| matmul_device_scalar(&args));
    let s = t.elapsed().as_secs_f64();
    println!(
        "reference matmul_device_scalar acc=f32 threads=1 {:.2} GMAC/s (16 rows)",
        (16 * k * n) as f64 / s / 1e9
    );
    // The whole reference of the model, device precision + f64 + bounds.
    let src = format!(
        "name = \"big\"\noutputs = [\"C\"]\n[inputs.A]\ndtype = \"f16\"\nshape = [{m}, {k}]\n[inputs.B]\ndtype = \"f16\"\n\
         shape = [{k}, {n}]\n[[ops]]\nop = \"matmul\"\na = \"A\"\nb = \"B\"\noutput = \"C\"\ndtype = \"f32\"\naccumulate = \"f32\"\n"
    );
    let g = ipu_host::model::parse("big.toml", &src).unwrap();
    let inputs = BTreeMap::from([("A".to_string(), a.clone()), ("B".to_string(), b.clone())]);
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let t = Instant::now();
        pool.install(|| evaluate(&g, &inputs, &[[1, 1, 1]], &[])).unwrap();
        let s = t.elapsed().as_secs_f64();
        println!(
            "reference evaluate (device + f64 + bounds) threads={threads} {s:.2} s {:.2} GMAC/s",
            macs / s / 1e9
        );
    }
}
