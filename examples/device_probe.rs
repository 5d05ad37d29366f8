use tessera::{kernel, Device, Grid, Tensor};

mod helpers {
    /// Scales a tile's rows by their max.
    #[tessera::device]
    pub fn norm_rows<const M: usize, const N: usize>(x: Tile<f32, M, N>) -> Tile<f32, M, N> {
        let m = row_max(x);
        x / m
    }

    #[tessera::device]
    pub fn twice<T, const N: usize>(x: Tile<T, 16, N>) -> (Tile<f32, 16, N>, Tile<f32, 16, N>) {
        let y = norm_rows(x.cast::<f32>());
        (y, y * 2.0)
    }
}
use helpers::*;

#[kernel]
pub fn k(x: Global<f32, 2>, y: Global<f32, 2>) {
    let r = block::id_y() * 16;
    let xt: Tile<f32, 16, 64> = x.load([r, 0]);
    let (a, b) = twice(xt);
    y.store([r, 0], a + b);
}

fn main() -> tessera::Result<()> {
    let dev = Device::cpu();
    let h: Vec<f32> = (0..32 * 64).map(|i| (i % 7) as f32 + 1.0).collect();
    let x = Tensor::from_host(&dev, &h, &[32, 64])?;
    let mut y = Tensor::<f32>::zeros(&dev, &[32, 64])?;
    k::launch(&dev, (Grid::tiles(64, 64), Grid::tiles(32, 16)), &x, &mut y)?;
    println!("{:?}", &y.to_host()?[..8]);
    println!("{}", k::SPEC.tirh.len());
    Ok(())
}
