//! The fp8 element types, [`F8E4M3`] and [`F8E5M2`], and their conversions on the host.
//!
//! The conversions are the GPU's: `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` rounds to the nearest
//! code (ties to the even code) and saturates, so that a value beyond the largest finite one,
//! an infinity included, gives the largest finite value of its sign, and a NaN of either sign
//! gives the code 0x7F. The interpreter rounds through the same functions, and
//! `tests/gpu_numerics.rs` pins them to the hardware's `cvt`, byte for byte. Widening is exact.
//!
//! ```
//! use tessera::{F8E4M3, F8E5M2};
//! assert_eq!(F8E4M3::from_f32(1000.0).to_f32(), 448.0); // saturates
//! assert_eq!(F8E4M3::from_f32(f32::INFINITY).to_bits(), 0x7E);
//! assert_eq!(F8E5M2::from_f32(-1e9).to_f32(), -57344.0);
//! assert!(F8E4M3::from_f32(f32::NAN).to_f32().is_nan());
//! ```

/// An fp8 format's layout.
#[derive(Clone, Copy)]
struct Format {
    mantissa_bits: u32,
    bias: i32,
    /// The largest finite code (of a positive value).
    max_code: u8,
    /// Whether the all-ones exponent holds infinities and NaNs (E5M2) rather than values and
    /// one NaN per sign (E4M3's mantissa all ones).
    ieee: bool,
}

const E4M3: Format = Format { mantissa_bits: 3, bias: 7, max_code: 0x7E, ieee: false };
const E5M2: Format = Format { mantissa_bits: 2, bias: 15, max_code: 0x7B, ieee: true };

/// The NaN code the GPU's saturating conversion gives for a NaN of either sign.
const NAN_CODE: u8 = 0x7F;

impl Format {
    /// The value of `code` (exact in f32).
    fn decode(self, code: u8) -> f32 {
        let m = u32::from(code) & ((1 << self.mantissa_bits) - 1);
        let e = (u32::from(code) & 0x7F) >> self.mantissa_bits;
        let all_ones = (1u32 << (7 - self.mantissa_bits)) - 1;
        let magnitude = if self.ieee && e == all_ones {
            if m == 0 {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else if !self.ieee && e == all_ones && m == (1 << self.mantissa_bits) - 1 {
            f32::NAN
        } else {
            let frac = m as f32 / (1u32 << self.mantissa_bits) as f32;
            if e == 0 {
                frac * 2f32.powi(1 - self.bias)
            } else {
                (1.0 + frac) * 2f32.powi(e as i32 - self.bias)
            }
        };
        if code & 0x80 != 0 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The nearest code to `x` (ties to the even code), saturating at the largest finite value;
    /// NaN gives [`NAN_CODE`].
    fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs().min(self.decode(self.max_code));
        // The codes of positive values increase with their values: the largest code not above
        // `a`, then the nearer of it and the next (every value and midpoint is exact in f64).
        let (mut lo, mut hi) = (0u8, self.max_code);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.decode(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let mut code = lo;
        if code < self.max_code {
            let (below, above) = (f64::from(self.decode(code)), f64::from(self.decode(code + 1)));
            let (d_lo, d_hi) = (f64::from(a) - below, above - f64::from(a));
            if d_hi < d_lo || (d_hi == d_lo && code % 2 == 1) {
                code += 1;
            }
        }
        sign | code
    }
}

macro_rules! fp8_type {
    ($name:ident, $format:expr, $dtype:ident, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Equality compares codes: `+0` and `−0` differ, and a NaN equals itself.
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name(u8);

        impl $name {
            /// The element with this byte as its code.
            pub const fn from_bits(code: u8) -> Self {
                $name(code)
            }

            /// The element's code.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// `x` rounded to the nearest value (ties to the even code), saturating at the
            /// largest finite value of its sign; NaN gives the code 0x7F. The GPU's
            /// `cvt.rn.satfinite`, bit for bit.
            pub fn from_f32(x: f32) -> Self {
                $name($format.encode(x))
            }

            /// The element's value (exact).
            pub fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}(0x{:02x}: {})", stringify!($name), self.0, self.to_f32())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        // SAFETY: a plain byte, passed and stored as one.
        unsafe impl cudarc::driver::DeviceRepr for $name {}
        // SAFETY: the zero byte is the code of +0.
        unsafe impl cudarc::driver::ValidAsZeroBits for $name {}

        impl crate::Element for $name {
            const DTYPE: tessera_ptx::DType = tessera_ptx::DType::$dtype;
        }
    };
}

fp8_type!(
    F8E4M3,
    E4M3,
    F8E4M3,
    "fp8 E4M3 (`f8e4m3` in kernels): a sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, largest ±448, smallest subnormal 2⁻⁹, NaN 0x7F/0xFF."
);
fp8_type!(
    F8E5M2,
    E5M2,
    F8E5M2,
    "fp8 E5M2 (`f8e5m2` in kernels): a sign, 5 exponent bits (bias 15), 2 mantissa bits; infinities 0x7C/0xFC, largest finite ±57344, smallest subnormal 2⁻¹⁶."
);

/// `x` rounded to an fp8 `dtype` as the GPU's saturating `cvt` does, and widened back (for the
/// interpreter); other dtypes are `None`.
pub(crate) fn round(dtype: tessera_ptx::DType, x: f32) -> Option<f32> {
    let f = format_of(dtype)?;
    Some(f.decode(f.encode(x)))
}

/// The code of `x` in an fp8 `dtype`; `None` for other dtypes.
pub(crate) fn encode(dtype: tessera_ptx::DType, x: f32) -> Option<u8> {
    Some(format_of(dtype)?.encode(x))
}

/// The value of `code` in an fp8 `dtype`; `None` for other dtypes.
pub(crate) fn decode(dtype: tessera_ptx::DType, code: u8) -> Option<f32> {
    Some(format_of(dtype)?.decode(code))
}

fn format_of(dtype: tessera_ptx::DType) -> Option<Format> {
    match dtype {
        tessera_ptx::DType::F8E4M3 => Some(E4M3),
        tessera_ptx::DType::F8E5M2 => Some(E5M2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of a code, written from the format's definition in f64 (apart from
    /// [`Format::decode`]).
    fn value(code: u8, e_bits: u32, m_bits: u32, ieee: bool) -> f64 {
        let bias = (1i32 << (e_bits - 1)) - 1;
        let (e, m) = ((i32::from(code) >> m_bits) & ((1 << e_bits) - 1), f64::from(code & ((1 << m_bits) - 1)));
        let top = (1 << e_bits) - 1;
        let v = if ieee && e == top {
            if m == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else if !ieee && e == top && m == f64::from((1u8 << m_bits) - 1) {
            f64::NAN
        } else if e == 0 {
            m / f64::from(1u32 << m_bits) * 2f64.powi(1 - bias)
        } else {
            (1.0 + m / f64::from(1u32 << m_bits)) * 2f64.powi(e - bias)
        };
        if code & 0x80 != 0 {
            -v
        } else {
            v
        }
    }

    #[test]
    fn every_code_decodes_to_its_value() {
        for code in 0..=255u8 {
            for (f, e, m, ieee) in [(E4M3, 4, 3, false), (E5M2, 5, 2, true)] {
                let (got, want) = (f.decode(code), value(code, e, m, ieee));
                assert!(got.is_nan() && want.is_nan() || f64::from(got) == want, "code 0x{code:02x}: {got} != {want}");
            }
        }
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in (0..=255u8).filter(|c| c & 0x7F <= 0x7E) {
            assert_eq!(F8E4M3::from_f32(F8E4M3::from_bits(code).to_f32()).to_bits(), code);
        }
        for code in (0..=255u8).filter(|c| c & 0x7F <= 0x7B) {
            assert_eq!(F8E5M2::from_f32(F8E5M2::from_bits(code).to_f32()).to_bits(), code);
        }
    }

    /// Midpoints go to the even code; anything past a midpoint to the nearer code.
    #[test]
    fn rounding_is_to_nearest_even() {
        let e4 = |x: f32| F8E4M3::from_f32(x).to_bits();
        assert_eq!(e4(1.0625), 0x38); // 1 + 1/16, halfway between 1 (0x38) and 1.125 (0x39)
        assert_eq!(e4(1.1875), 0x3A); // halfway between 1.125 (0x39) and 1.25 (0x3A)
        assert_eq!(e4(1.0626), 0x39);
        assert_eq!(e4(2f32.powi(-10)), 0x00); // half the smallest subnormal: to 0
        assert_eq!(e4(3.0 * 2f32.powi(-10)), 0x02); // between codes 1 and 2: to 2
        assert_eq!(e4(-1e-10), 0x80);
        let e5 = |x: f32| F8E5M2::from_f32(x).to_bits();
        assert_eq!(e5(1.125), 0x3C); // halfway between 1 (0x3C) and 1.25 (0x3D)
        assert_eq!(e5(1.375), 0x3E); // halfway between 1.25 and 1.5
    }

    #[test]
    fn beyond_the_range_saturates_and_nan_is_7f() {
        for (x, e4, e5) in [
            (448.0, 0x7E, 0x5F),
            (464.0, 0x7E, 0x5F),
            (1e6, 0x7E, 0x7B),
            (f32::INFINITY, 0x7E, 0x7B),
            (f32::NEG_INFINITY, 0xFE, 0xFB),
            (-500.0, 0xFE, 0xE0),
            (f32::NAN, 0x7F, 0x7F),
            (-f32::NAN, 0x7F, 0x7F),
        ] {
            assert_eq!(F8E4M3::from_f32(x).to_bits(), e4, "e4m3 of {x}");
            assert_eq!(F8E5M2::from_f32(x).to_bits(), e5, "e5m2 of {x}");
        }
    }
}
