# Six workers per tile streaming f16 AMP bundles in an `rpt` loop (the matmul inner loop), all of
# them loading and storing the same addresses: the `amp` row of benches/benches/sim_throughput.rs
# (kept as it was first measured, so the row compares across versions) and the shared-rows case
# of tests/tests/sim_batch.rs (the simulator must run it in the barrel's order).
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
    setzi $m3, 0x80000
    setzi $m4, 0x90000
    setzi $m5, 0xa0000
    setzi $m2, 1000
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    nop
    nop
    nop
    rpt $m2, 4
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 0 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 1 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 2 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 3 }
    exit
.org 0x7f200
weights: .space 512
