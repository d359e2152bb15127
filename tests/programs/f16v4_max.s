# One worker: f16v4max lane by lane, the larger of each pair of lanes, a NaN lane ignored when the
# other is a number (docs/target.md §4.7). Timing as f16v4_sub.s: worker slot 0 issues at 6, 12,
# ...: ld64@6 ld64@12 f16v4max@18 st64@24 exit@30. Supervisor: sync 2 @31, sync 15 @32,
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
    f16v4max $a4, $a0, $a2
    st64 $a4, $m1, $m15, 16
    exit
.org 0x60000
data:
    .word 0xC0003E00, 0xFC007E00   # a: 1.5, -2.0, NaN, -inf
    .word 0xC2003800, 0xFBFF3C00   # b: 0.5, -3.0, 1.0, -65504
    .space 8                       # max(a, b)
