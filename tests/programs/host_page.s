# Host page round trip: the host writes a 4096-byte page, the supervisor adds 1 to each word,
# the host reads it back.
# Run 1: sync 15 @0, release 90. Run 2 (from 90): setzi@90 setzi@91, 1024 x 5 issues @92..5211,
# sync 15 @5212, release 5302: 5212 cycles.
main:
    sync 15
    setzi $m1, page
    setzi $m2, 1023
loop:
    ld32 $m3, $m1, $m15, 0
    add $m3, $m3, 1
    st32 $m3, $m1, $m15, 0
    add $m1, $m1, 4
    brnzdec $m2, loop
    sync 15
    halt
.org 0x80000
page: .space 4096
