# Tile 0 sends four words to tile 1 (docs/target.md §5).
# sync 3 @0 releases both tiles at 90. setzi@90, send@91: words leave at 91..94 (cost 4),
# they reach tile 1 at 91+13 .. 94+13 (latency(0,1) = 11 + 2 lanes).
main:
    sync 3
    setzi $m1, data
    send 4, data, 1
    delay DRAIN
    sync 3
    sync 15
    halt
.org 0x60000
data: .word 0x11111111, 0x22222222, 0x33333333, 0x44444444
