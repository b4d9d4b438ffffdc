//! Prints the fused decode-layer kernel's CUDA source as JSON (`header`,
//! `body`, `inputs`), the source `xtask/gpu/layer_phases.py` stamps and
//! times on the GPU machine:
//! `cargo run --release -p gemma --example decode_layer_source > source.json`.

fn main() {
    let (header, body, inputs) = gemma::cuda::decode_layer_source();
    let json = serde_json::json!({ "header": header, "body": body, "inputs": inputs.to_vec() });
    println!("{json}");
}
