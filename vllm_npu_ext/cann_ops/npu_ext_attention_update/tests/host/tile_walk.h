/**
 * The kernel's loop structure on the host: every launched core (block), then every tile of
 * its rows, in the kernel's order (Init: RowsOfCore; Process: TileCount, RowsOfTile).
 * The coverage sweep walks tiles through it, in the order the kernel runs them.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_TILE_WALK_H
#define NPU_EXT_ATTENTION_UPDATE_TILE_WALK_H

#include "attention_update_tiling_math.h"

namespace npu_ext_au {

/** Calls visitor.BeginCore(block, core) once per core, then visitor.Tile(core, progress,
 * rows) for each of its tiles. */
template <typename Visitor>
void WalkTiles(const AttentionUpdateTiling &tiling, Visitor &visitor)
{
    for (uint32_t block = 0; block < tiling.usedCoreNum; ++block) {
        const CoreRows core = RowsOfCore(tiling, block);
        visitor.BeginCore(block, core);
        const uint32_t tiles = TileCount(core.rows, tiling.tileLength);
        for (uint32_t progress = 0; progress < tiles; ++progress) {
            visitor.Tile(core, progress, RowsOfTile(core.rows, tiling.tileLength, progress));
        }
    }
}

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_TILE_WALK_H
