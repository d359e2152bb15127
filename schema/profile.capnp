# Profile of one `run` call of an application package (docs/profile.md).
# Written by `ipu-codegen run --profile FILE.capnp`; read by `ipu-codegen profile` and `report`,
# by `capnp decode schema/profile.capnp Profile < FILE.capnp`, and by pycapnp.
# The message is a single-segment, unpacked Cap'n Proto message.

@0xe552ee4109faa0b1;

struct Profile {
  schemaVersion @0 :UInt32;      # 1
  clockHz @1 :UInt64;            # tile clock; cycles / clockHz = seconds
  package @2 :Text;              # package path as given to `run`
  packageSha256 @3 :Text;        # of the package file, hex
  device @4 :Text;               # `sim` or the device path
  tileCount @5 :UInt32;          # tiles of the target (= tiles.length)
  runStart @6 :UInt64;           # device cycle of the host-sync release that started the call
  runCycles @7 :UInt64;          # cycles of the call, release to release
  iteration @8 :UInt32;          # which resident inference was profiled (1-based: the last)
  phaseNames @9 :List(Text);     # Sample.phase indexes this
  kernelNames @10 :List(Text);   # Sample.kernel indexes this (noKernel: none)
  tiles @11 :List(TileProfile);  # one per tile, in tile order
}

const noKernel :UInt16 = 0xffff;

enum Kind {
  compute @0;    # worker kernels and supervisor set-up
  sync @1;       # waiting in an internal sync
  exchange @2;   # an exchange superstep up to its closing sync
  host @3;       # host-sync release to the first phase
}

struct Sample {
  phase @0 :UInt16;
  kind @1 :Kind;
  kernel @2 :UInt16;
  start @3 :UInt64;   # device cycles, same clock on every tile
  end @4 :UInt64;     # start <= end; samples of a tile are contiguous and in order
}

struct Memory {
  code @0 :UInt32;
  tensors @1 :UInt32;
  descriptors @2 :UInt32;
  exchange @3 :UInt32;
  host @4 :UInt32;
  profile @5 :UInt32;
}

struct TileProfile {
  tile @0 :UInt16;
  samples @1 :List(Sample);
  memory @2 :Memory;   # bytes by kind
}
