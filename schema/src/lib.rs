//! `ipu-schema`: on-disk formats (package container, sections, host-exchange layout); no_std.
#![no_std]
