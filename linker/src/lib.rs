//! `ipu-linker`: places sections into tile memory and produces tile images; no_std.
#![no_std]
