# Six workers stream f16 AMP bundles (the matmul inner loop) over rows of their own: worker k
# loads from X + k·2^STRIDE and PIN + k·2^STRIDE and stores to OUT + k·2^STRIDE, ROWS iterations
# of four bundles. A template: `{X}`, `{PIN}`, `{OUT}`, `{STRIDE}`, `{ROWS}` are filled in by
# tests/tests/sim_batch.rs (disjoint, overlapping and out-of-memory rows) and by
# benches/benches/sim_throughput.rs (the `amp-rows` row).
main:
    setzi $m1, weights
    ldcwei $m1
    setzi $m0, worker
    setzi $m1, 0
    runall $m0, $m1
    sync 2
    sync 15
    halt
.align 8
worker:
    shl $m6, $m0, {STRIDE}
    setzi $m3, {X}
    add $m3, $m3, $m6
    setzi $m4, {PIN}
    add $m4, $m4, $m6
    setzi $m5, {OUT}
    add $m5, $m5, $m6
    setzi $m2, {ROWS}
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    nop
    rpt $m2, 4
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 0 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 1 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 2 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 3 }
    exit
.org 0x5f000
weights: .space 512
