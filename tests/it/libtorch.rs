//! libtorch is installed and linked: a tiny network learns on CPU.

use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[test]
fn a_tiny_network_trains_on_cpu_and_its_loss_falls() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 4, 16, Default::default()))
        .add_fn(|x| x.tanh())
        .add(nn::linear(vs.root() / "l2", 16, 1, Default::default()));
    // Target: y = sum of inputs, a function the network can fit quickly.
    let x = Tensor::randn([64, 4], (Kind::Float, Device::Cpu));
    let y = x.sum_dim_intlist(1, true, Kind::Float);
    let mut opt = nn::Adam::default().build(&vs, 1e-2).unwrap();

    let loss_at = |net: &nn::Sequential| net.forward(&x).mse_loss(&y, tch::Reduction::Mean);
    let first = loss_at(&net).double_value(&[]);
    for _ in 0..50 {
        opt.backward_step(&loss_at(&net));
    }
    let last = loss_at(&net).double_value(&[]);
    assert!(last < first * 0.2, "loss went from {first} to {last}, expected a fall of 5x");
}
