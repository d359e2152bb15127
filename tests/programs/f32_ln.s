# One worker: f32ln on 2, 0.5, 10, 0 and -1, each costing 2 issues (docs/target.md §4.3, §4.6).
# Timing: setzi@0 setzi@1 run@2 -> worker slot 0 issues at 6,12,...; a cost-2 instruction issued
# at T makes the worker's next issue T + 12. Worker: lda32 @6..@30 (5), f32ln @36 @48 @60 @72 @84,
# sta32 @96..@120 (5), exit@126. Supervisor: sync 2 @127, sync 15 @128, release 128 + 90 = 218.
main:
    setzi $m0, worker
    setzi $m1, data
    run $m0, $m1
    sync 2
    sync 15
    halt
worker:
    lda32 $a0, $m1, $m15, 0
    lda32 $a1, $m1, $m15, 4
    lda32 $a2, $m1, $m15, 8
    lda32 $a3, $m1, $m15, 12
    lda32 $a4, $m1, $m15, 16
    f32ln $a0, $a0
    f32ln $a1, $a1
    f32ln $a2, $a2
    f32ln $a3, $a3
    f32ln $a4, $a4
    sta32 $a0, $m1, $m15, 20
    sta32 $a1, $m1, $m15, 24
    sta32 $a2, $m1, $m15, 28
    sta32 $a3, $m1, $m15, 32
    sta32 $a4, $m1, $m15, 36
    exit
.org 0x60000
data:
    .word 0x40000000, 0x3f000000, 0x41200000, 0x00000000, 0xbf800000   # 2, 0.5, 10, 0, -1
    .space 20                                                          # their logarithms
