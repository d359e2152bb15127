//! The `slice` op (docs/model-format.md): a box of a tensor made on the chip, read where its bytes
//! are (a view, no stage of its own) — the crop of an image whose sides are not multiples of the
//! patch size, then the patch reshape/transpose views and the patch matmul; a slice inside a
//! chain of row stages; on 1 to 64 tiles, bit-exact against the device-precision reference and
//! within the f64 bound. A slice whose rows start inside a word is refused with the reason.

mod common;

use ipu_host::build::{build, BuildOptions};

fn run(src: &str, tiles: usize) -> u64 {
    let (out, _) = common::build_and_run(src, tiles, None, 9, 1);
    assert!(out.compared_elements > 0 && out.max_abs_error_f64 <= out.bound_f64, "{out:?}");
    // A view: no stage of its own.
    let g = ipu_host::model::parse("m.toml", src).unwrap();
    let plan = ipu_core::plan::plan(&g, ipu_core::plan::PlanOptions::new(tiles)).unwrap();
    assert!(plan.mapping.iter().all(|m| !m.contains("slice")), "{:?}", plan.mapping);
    out.cycles[0]
}

const CROP: &str = "name = \"crop\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [1, 3, 31, 30]\n\
[inputs.W]\ndtype = \"f16\"\nshape = [588, 16]\n\
[[ops]]\nop = \"gelu\"\ninput = \"X\"\noutput = \"G\"\ndtype = \"f16\"\napproximate = \"tanh\"\n\
[[ops]]\nop = \"slice\"\ninput = \"G\"\noutput = \"C\"\ndtype = \"f16\"\nstarts = [0, 0, 0, 0]\nends = [1, 3, 28, 28]\n\
[[ops]]\nop = \"reshape\"\ninput = \"C\"\noutput = \"R\"\ndtype = \"f16\"\nshape = [1, 3, 2, 14, 2, 14]\n\
[[ops]]\nop = \"transpose\"\ninput = \"R\"\noutput = \"T\"\ndtype = \"f16\"\nperm = [0, 2, 4, 1, 3, 5]\n\
[[ops]]\nop = \"reshape\"\ninput = \"T\"\noutput = \"P\"\ndtype = \"f16\"\nshape = [4, 588]\n\
[[ops]]\nop = \"matmul\"\na = \"P\"\nb = \"W\"\noutput = \"Y\"\ndtype = \"f16\"\naccumulate = \"f32\"\n";

#[test]
fn an_image_cropped_to_whole_patches_feeds_the_patch_matmul() {
    for tiles in [1, 8, 64] {
        run(CROP, tiles);
    }
}

#[test]
fn a_box_inside_a_chain_of_row_stages() {
    let src = "name = \"box\"\noutputs = [\"Y\"]\n[inputs.X]\ndtype = \"f16\"\nshape = [2, 9, 40]\n\
               [[ops]]\nop = \"exp\"\ninput = \"X\"\noutput = \"E\"\ndtype = \"f16\"\n\
               [[ops]]\nop = \"slice\"\ninput = \"E\"\noutput = \"S\"\ndtype = \"f16\"\nstarts = [1, 2, 4]\nends = [2, 8, 40]\n\
               [[ops]]\nop = \"tanh\"\ninput = \"S\"\noutput = \"Y\"\ndtype = \"f16\"\n";
    for tiles in [1, 4, 64] {
        run(src, tiles);
    }
}

#[test]
fn bad_boxes_are_refused_with_the_reason() {
    let opts = BuildOptions { threads: 1, ..BuildOptions::new(4) };
    // Out of range: names the op and the rule.
    let e = build("m.toml", &CROP.replace("ends = [1, 3, 28, 28]", "ends = [1, 3, 32, 28]"), &opts)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("op 1 (slice)") && e.contains("0 ≤ start < end ≤ size"), "{e}");
    // A view keeps its input's dtype.
    let e = build(
        "m.toml",
        &CROP.replace("output = \"C\"\ndtype = \"f16\"", "output = \"C\"\ndtype = \"f32\""),
        &opts,
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("op 1 (slice): field `dtype`: a slice keeps the dtype: `G` is f16"), "{e}");
    // Rows that start one f16 into a word: moved by whole words only, refused naming the tensor.
    let odd = CROP.replace(
        "starts = [0, 0, 0, 0]\nends = [1, 3, 28, 28]",
        "starts = [0, 0, 0, 1]\nends = [1, 3, 28, 29]",
    );
    let e = build("m.toml", &odd, &opts).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("tensor `P`") && e.contains("whole aligned words") && e.contains("slice"), "{e}");
}
