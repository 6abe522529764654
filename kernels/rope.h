// Rotary position embedding: plain RoPE, partial rotary dims, M-RoPE.
#pragma once

#include <cstdint>

namespace qtk {

// In place on x: f32 [rows, heads, head_dim], row (token) stride ld floats,
// heads contiguous (head h of row t at x + t*ld + h*head_dim).
// rotate_half style on the first rotary_dim dims of each head (pairs i and
// i + rotary_dim/2); dims >= rotary_dim are untouched.
//   positions: int32 [3][rows] (temporal, height, width; text: all equal).
//     With mrope_section == nullptr only positions[0][*] is read.
//   mrope_section: int64 [n_sections] (3) or nullptr for plain RoPE.
//   interleaved: Qwen3.5 / Qwen3-VL layout (frequency j takes axis a in {1,2}
//     when j % 3 == a and j < 3*section[a], else the temporal axis);
//     otherwise contiguous sections [t: s0][h: s1][w: s2].
// note: transformers computes inv_freq = 1 / theta^(2j/rotary_dim) and the
// angle inv_freq * position in float32 (autocast off, even for a float64
// model), then cos/sin of that float32 angle. We reproduce those float32
// roundings of inv_freq and angle, since that is what the reference computes,
// evaluate cos/sin in double and round them to float32 like the reference,
// and do the rotation itself in double with one rounding per output.
//
//
// note: inv_freq stays float32 whatever the weights' dtype. transformers
// computes the inv_freq buffer in float32 from the config when the model is
// built and `from_pretrained` never casts it to the checkpoint's dtype (a
// bf16 checkpoint loaded in bf16, float32 or float64 rotates by the same
// float32 frequencies). Rounding it to bf16 turns the angle at position p by
// up to p * 2^-9 * inv_freq: visible from a few hundred positions on
// (qwen3-tiny's len1000 golden diverged at step 6 that way).
void rope_apply(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t ld,
                const int32_t* positions, int64_t rotary_dim, double theta,
                const int64_t* mrope_section, int n_sections, bool interleaved);

// Which position axis (0 = t, 1 = h, 2 = w) frequency j (< rotary_dim/2) uses.
int rope_axis_of_frequency(int64_t j, const int64_t* mrope_section, int n_sections,
                           bool interleaved);

}  // namespace qtk
