/**
 * The kernel's element types on the host: `half` (IEEE binary16, the compiler's _Float16) and
 * `bfloat16_t` (the upper half of an fp32), with the conversions Cast performs:
 * to fp32 exactly (CAST_NONE), from fp32 rounding to nearest even (CAST_RINT; NaN stays a
 * quiet NaN). In CANN both are global type names, so they are here too.
 */
#ifndef ASCENDC_HOST_TYPES_H
#define ASCENDC_HOST_TYPES_H

#include <cstdint>
#include <cstring>

using half = _Float16;

struct bfloat16_t {
    uint16_t bits = 0;

    constexpr bfloat16_t() = default;
    // Implicit, as in CANN, so that `T paddingValue = 0` works for every element type.
    bfloat16_t(float value) : bits(FromFloat(value)) {}  // NOLINT(google-explicit-constructor)

    static uint16_t FromFloat(float value)
    {
        uint32_t word;
        std::memcpy(&word, &value, sizeof(word));
        if ((word & 0x7FFFFFFFU) > 0x7F800000U) {
            return static_cast<uint16_t>((word >> 16) | 0x0040U);
        }
        const uint32_t roundingBias = 0x7FFFU + ((word >> 16) & 1U);
        return static_cast<uint16_t>((word + roundingBias) >> 16);
    }

    float ToFloat() const
    {
        const uint32_t word = static_cast<uint32_t>(bits) << 16;
        float value;
        std::memcpy(&value, &word, sizeof(value));
        return value;
    }
};

namespace ascendc_host {

inline float ToFloat(float value) { return value; }
inline float ToFloat(half value) { return static_cast<float>(value); }
inline float ToFloat(bfloat16_t value) { return value.ToFloat(); }

/** fp32 -> T rounding to nearest even (the only narrowing rounding the shim models). */
template <typename T>
T FromFloatRint(float value);

template <>
inline float FromFloatRint<float>(float value) { return value; }

template <>
inline half FromFloatRint<half>(float value) { return static_cast<half>(value); }

template <>
inline bfloat16_t FromFloatRint<bfloat16_t>(float value) { return bfloat16_t(value); }

}  // namespace ascendc_host

#endif  // ASCENDC_HOST_TYPES_H
