// TMA descriptors for the sm90 kernel family: encodes one attention tensor (generator/tma_layout.hpp's TmaTensor,
// which says what TMA can describe) as a 4-D tiled tensor map with 128-byte swizzling, through the
// driver's cuTensorMapEncodeTiled.
#pragma once

#include "generator/tma_layout.hpp"
#include "templates/attn_params.cuh"

namespace flashgen {

// Fills *map for boxes of (128 bytes of columns, box_rows rows); a box reaching past head_dim (the tiles' padding,
// sm90_tile_dim) is zero-filled on load and clipped on store. Throws Error(kCuda) when the driver refuses a
// tensor that tma_unsupported_reason accepted.
void encode_tma_map(TmaDescriptor* map, const TmaTensor& t, int box_rows);

// Whether retarget_tma_map may be used with this driver. Its encoding is opaque: the first call in a
// process encodes one tensor at two base addresses and checks that the maps differ only in their first
// 8 bytes, which hold the address. Where they do not, a kept launch encodes its maps anew.
bool tma_maps_retargetable();

// Points an encoded map at another base address (16-byte aligned) of a tensor of the same shape, for a
// launch kept from an earlier call: a copy of 8 bytes instead of an encoding. Needs tma_maps_retargetable().
void retarget_tma_map(TmaDescriptor* map, const void* data);

}  // namespace flashgen
