# One worker: f16v4sub lane by lane, each lane computed in f32 and rounded once to f16, nearest
# even (docs/target.md §4.7). Timing as f32_sqrt.s: worker slot 0 issues at 6, 12, ...:
# ld64@6 ld64@12 f16v4sub@18 st64@24 exit@30. Supervisor: sync 2 @31, sync 15 @32,
# release 32 + 90 = 122.
main:
    setzi $m0, worker
    setzi $m1, data
    run $m0, $m1
    sync 2
    sync 15
    halt
worker:
    ld64 $a0, $m1, $m15, 0
    ld64 $a2, $m1, $m15, 8
    f16v4sub $a4, $a0, $a2
    st64 $a4, $m1, $m15, 16
    exit
.org 0x60000
data:
    .word 0x3C003E00, 0xFBFFBC00   # a: 1.5, 1.0, -1.0, -65504
    .word 0x0C003800, 0x7BFF3C00   # b: 0.5, 2^-12, 1.0, 65504
    .space 8                       # a - b
