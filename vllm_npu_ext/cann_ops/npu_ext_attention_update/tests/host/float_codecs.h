/**
 * The three go/out storage types of the kernel on the host, with the kernel's conversions:
 * to fp32 exactly (Cast CAST_NONE), from fp32 rounding to nearest even (Cast CAST_RINT).
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_FLOAT_CODECS_H
#define NPU_EXT_ATTENTION_UPDATE_FLOAT_CODECS_H

#include <cstdint>
#include <cstring>

namespace npu_ext_au {

struct Float32Codec {
    using Storage = float;
    static float ToFloat(float value) { return value; }
    static float FromFloat(float value) { return value; }
};

/** IEEE half, through the compiler's _Float16 (round to nearest even). */
struct Float16Codec {
    using Storage = uint16_t;
    static float ToFloat(uint16_t bits)
    {
        _Float16 value;
        std::memcpy(&value, &bits, sizeof(bits));
        return static_cast<float>(value);
    }
    static uint16_t FromFloat(float value)
    {
        const _Float16 half = static_cast<_Float16>(value);
        uint16_t bits;
        std::memcpy(&bits, &half, sizeof(bits));
        return bits;
    }
};

/** bfloat16: the upper half of an fp32, rounded to nearest even; NaN stays a quiet NaN. */
struct BFloat16Codec {
    using Storage = uint16_t;
    static float ToFloat(uint16_t bits)
    {
        const uint32_t wide = static_cast<uint32_t>(bits) << 16;
        float value;
        std::memcpy(&value, &wide, sizeof(value));
        return value;
    }
    static uint16_t FromFloat(float value)
    {
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof(bits));
        if ((bits & 0x7FFFFFFFU) > 0x7F800000U) {
            return static_cast<uint16_t>((bits >> 16) | 0x0040U);
        }
        const uint32_t roundingBias = 0x7FFFU + ((bits >> 16) & 1U);
        return static_cast<uint16_t>((bits + roundingBias) >> 16);
    }
};

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_FLOAT_CODECS_H
