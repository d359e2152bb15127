# AMP block: out[r] = X[r]·W + P[r] for R rows, W a 16x16 f16 block in CWEI (docs/target.md §4.4).
# Each worker streams its own rows; the descriptor table at `desc` holds per worker
# (x, pin, out - 40, R + 1). The pipeline writes row r-1 while row r goes in, so the first
# five stores land in a scratch area before `out` (see tests/tests/sim_programs.rs for the
# cycle derivation).
.equ WORKERS, 6
main:
    setzi $m1, weights
    ldcwei $m1
    setzi $m0, worker
    setzi $m1, desc
    runall $m0, $m1      # `run` in the one-worker variant (patched by the test)
    sync 2
    sync 15
    halt
.align 8
worker:
    shl $m6, $m0, 4
    add $m6, $m1, $m6
    ld32 $m3, $m6, $m15, 0
    ld32 $m4, $m6, $m15, 4
    ld32 $m5, $m6, $m15, 8
    ld32 $m2, $m6, $m15, 12
    ld64pi $a0, $m3, 8
    ld64pi $a2, $m4, 8
    nop
    rpt $m2, 4
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 0 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 1 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 2 }
    { ld2st64pi $a0, $a2, $a4, $m3, $m4, $m5 ; f16amp $a4, $a2, $a0, 3 }
    st64pi $a4, $m5, 8
    exit
.org 0x7f000
desc: .space 96
.org 0x7f200
weights: .space 512
