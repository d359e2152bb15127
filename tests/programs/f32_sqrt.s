# One worker: f32sqrt and 1/sqrt as f32div, each costing 2 issues (docs/target.md §4.3, §4.6).
# Timing: setzi@0 setzi@1 run@2 -> worker slot 0 issues at 6,12,...; a cost-2 instruction issued
# at T makes the worker's next issue T + 12. Worker: lda32@6 lda32@12 f32sqrt@18 f32div@30
# sta32@42 sta32@48 lda32@54 f32sqrt@60 sta32@72 exit@78. Supervisor: sync 2 @79, sync 15 @80,
# release 80 + 90 = 170.
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
    f32sqrt $a2, $a0
    f32div $a3, $a1, $a2
    sta32 $a2, $m1, $m15, 12
    sta32 $a3, $m1, $m15, 16
    lda32 $a4, $m1, $m15, 8
    f32sqrt $a5, $a4
    sta32 $a5, $m1, $m15, 20
    exit
.org 0x60000
data:
    .word 0x40000000, 0x3f800000, 0xbf800000   # 2.0f, 1.0f, -1.0f
    .space 12                                  # sqrt(2), 1/sqrt(2), sqrt(-1)
