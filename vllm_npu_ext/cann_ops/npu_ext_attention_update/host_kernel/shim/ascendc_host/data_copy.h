/**
 * DataCopyPad with DataCopyExtParams on the host, as documented for Atlas A2/A3
 * (AscendC 数据搬运: "DataCopyPad（GMToUB非对齐数据搬运）", "DataCopyPad（UBToGM非对齐数据搬运）"):
 *   - blockCount in [0, 4095], blockLen in [0, 2097151] bytes and a multiple of sizeof(T);
 *     either 0 makes the call a no-op;
 *   - the UB side starts 32-byte aligned; the GM side is byte-addressed (no alignment);
 *   - GM->UB: block b is read from GM byte b * (blockLen + srcStride) and lands in UB at
 *     b * (AlignUp(left + blockLen + right, 32) + dstStride * 32): leftPadding/rightPadding
 *     elements (at most 32 bytes each) around the data, then "dummy" bytes up to the 32-byte
 *     boundary. Padding and dummy are paddingValue when isPad; with isPad false they are
 *     undefined ("随机值": poisoned here), except that with no left/right padding the dummy
 *     repeats the block's first element, as documented;
 *   - UB->GM: block b is read from UB at b * (AlignUp(blockLen, 32) + srcStride * 32) and
 *     exactly blockLen bytes are written to GM byte b * (blockLen + dstStride).
 * SetPadValue (isPad false with a register-set value) is not modelled.
 */
#ifndef ASCENDC_HOST_DATA_COPY_H
#define ASCENDC_HOST_DATA_COPY_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "ascendc_host/runtime.h"
#include "ascendc_host/tensor.h"

namespace AscendC {

struct DataCopyExtParams {
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;
    uint8_t rightPadding = 0;
    T paddingValue = 0;
};

}  // namespace AscendC

namespace ascendc_host {

constexpr uint32_t kMaxBlockCount = 4095;
constexpr uint32_t kMaxBlockLen = 2097151;

/** The checks both directions share; false when the call is a no-op. */
template <typename T>
bool CheckCopyParams(const char *api, const AscendC::DataCopyExtParams &params)
{
    if (params.blockCount == 0 || params.blockLen == 0) {
        return false;
    }
    if (params.blockCount > kMaxBlockCount || params.blockLen > kMaxBlockLen) {
        Fail(api, "blockCount " + std::to_string(params.blockCount) + " or blockLen " +
                      std::to_string(params.blockLen) + " outside [0, 4095] x [0, 2097151]");
    }
    if (params.blockLen % sizeof(T) != 0) {
        Fail(api, "blockLen " + std::to_string(params.blockLen) + " is not a multiple of " +
                      std::to_string(sizeof(T)) + " bytes");
    }
    return true;
}

/** Fill `count` elements at `at` with `value`, or poison them when the value is undefined. */
template <typename T>
void FillPadding(uint8_t *at, uint64_t count, bool defined, const T &value)
{
    for (uint64_t i = 0; i < count; ++i) {
        if (defined) {
            std::memcpy(at + i * sizeof(T), &value, sizeof(T));
        } else {
            std::memset(at + i * sizeof(T), kPoisonByte, sizeof(T));
        }
    }
}

}  // namespace ascendc_host

namespace AscendC {

/** GM -> UB (VECIN/VECOUT), MTE2. */
template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T> &dst, const GlobalTensor<T> &src,
                                   const DataCopyExtParams &params,
                                   const DataCopyPadExtParams<T> &padParams)
{
    constexpr const char *kApi = "DataCopyPad(GM->UB)";
    if (!ascendc_host::CheckCopyParams<T>(kApi, params)) {
        return;
    }
    const uint64_t left = padParams.leftPadding * sizeof(T);
    const uint64_t right = padParams.rightPadding * sizeof(T);
    if (left > ascendc_host::kUbBlockBytes || right > ascendc_host::kUbBlockBytes) {
        ascendc_host::Fail(kApi, "leftPadding/rightPadding over 32 bytes");
    }
    const uint64_t blockBytes = ascendc_host::AlignUp(left + params.blockLen + right, 32);
    const uint64_t ubStride = blockBytes + static_cast<uint64_t>(params.dstStride) * 32;
    const uint64_t span = (params.blockCount - 1) * ubStride + blockBytes;
    uint8_t *ub = dst.Access(kApi, 0, span / sizeof(T), ascendc_host::Unit::kCopyIn);
    for (uint32_t block = 0; block < params.blockCount; ++block) {
        const uint64_t gmOffset =
            static_cast<uint64_t>(block) * (params.blockLen + params.srcStride);
        const uint8_t *gm = src.Bytes(kApi, gmOffset, params.blockLen, false);
        uint8_t *at = ub + block * ubStride;
        const bool padded = padParams.leftPadding != 0 || padParams.rightPadding != 0;
        ascendc_host::FillPadding(at, padParams.leftPadding, padParams.isPad,
                                  padParams.paddingValue);
        std::memcpy(at + left, gm, params.blockLen);
        ascendc_host::FillPadding(at + left + params.blockLen, padParams.rightPadding,
                                  padParams.isPad, padParams.paddingValue);
        const uint64_t used = left + params.blockLen + right;
        T dummy;
        std::memcpy(&dummy, padded ? &padParams.paddingValue : static_cast<const void *>(gm),
                    sizeof(T));
        ascendc_host::FillPadding(at + used, (blockBytes - used) / sizeof(T),
                                  !padded || padParams.isPad, dummy);
    }
}

/** UB (VECIN/VECOUT) -> GM, MTE3: exactly blockLen bytes per block reach GM. */
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T> &dst, const LocalTensor<T> &src,
                                   const DataCopyExtParams &params)
{
    constexpr const char *kApi = "DataCopyPad(UB->GM)";
    if (!ascendc_host::CheckCopyParams<T>(kApi, params)) {
        return;
    }
    const uint64_t blockBytes = ascendc_host::AlignUp(params.blockLen, 32);
    const uint64_t ubStride = blockBytes + static_cast<uint64_t>(params.srcStride) * 32;
    const uint64_t span = (params.blockCount - 1) * ubStride + params.blockLen;
    const uint8_t *ub = src.Access(kApi, 0, span / sizeof(T), ascendc_host::Unit::kCopyOut);
    for (uint32_t block = 0; block < params.blockCount; ++block) {
        const uint64_t gmOffset =
            static_cast<uint64_t>(block) * (params.blockLen + params.dstStride);
        uint8_t *gm = dst.Bytes(kApi, gmOffset, params.blockLen, true);
        std::memcpy(gm, ub + block * ubStride, params.blockLen);
        ascendc_host::GmRegion &region = ascendc_host::GmRegionOf(kApi, gm, params.blockLen, true);
        const uint64_t first = static_cast<uint64_t>(gm - region.base);
        for (uint64_t i = first; i < first + params.blockLen; ++i) {
            region.writes[i] = static_cast<uint8_t>(std::min(region.writes[i] + 1, 255));
        }
        region.copyBytes.push_back(params.blockLen);
    }
}

}  // namespace AscendC

#endif  // ASCENDC_HOST_DATA_COPY_H
