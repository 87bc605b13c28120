use kernel_ir::{Array, DType};

use super::*;

const ADD: &str = r#"
module {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = "stablehlo.add"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}
"#;

#[test]
fn cpu_client_runs_a_program_without_consuming_its_inputs() {
    let client = Client::cpu(2).unwrap();
    assert_eq!(client.platform(), "cpu");
    assert_eq!(client.devices().len(), 2);
    let a = Array::from_elems([2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let b = Array::from_elems([2, 3], &[10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0]).unwrap();
    let (ba, bb) = (client.upload(&a, 0).unwrap(), client.upload(&b, 0).unwrap());
    let exe = client
        .compile(ADD.as_bytes(), &CompileOptions::default())
        .unwrap();
    assert_eq!(exe.num_outputs(), 1);
    for _ in 0..2 {
        let out = exe.execute(&[&ba, &bb]).unwrap();
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(
            out[0].to_host().unwrap().data(),
            &[11.0, 22.0, 33.0, 44.0, 55.0, 66.0]
        );
    }
    // The inputs are still usable.
    assert_eq!(ba.to_host().unwrap(), a);
}

#[test]
fn every_dtype_round_trips_through_a_device() {
    let client = Client::cpu(1).unwrap();
    for d in DType::ALL {
        let a = Array::random(d, [3, 5], 7, -3.0, 3.0);
        let buf = client.upload(&a, 0).unwrap();
        assert_eq!(buf.dtype(), d);
        assert_eq!(buf.to_host().unwrap(), a, "{d}");
    }
}

#[test]
fn a_bad_program_is_an_error_not_a_crash() {
    let client = Client::cpu(1).unwrap();
    let e = client
        .compile(b"module { this is not mlir }", &CompileOptions::default())
        .expect_err("compilation fails");
    assert!(
        matches!(
            e,
            PjrtError::Plugin {
                what: "compilation",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn all_reduce_across_four_devices() {
    let client = Client::cpu(4).unwrap();
    let text = r#"
module @sum attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.all_reduce"(%x) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = "stablehlo.add"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%s) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;
    let exe = client
        .compile(
            text.as_bytes(),
            &CompileOptions {
                num_replicas: 4,
                num_partitions: 1,
                static_assignment: false,
                shardy: false,
            },
        )
        .unwrap();
    let inputs: Vec<Buffer> = (0..4)
        .map(|d| {
            let v = [d as f32, 10.0 * d as f32, 1.0, -(d as f32)];
            client
                .upload(&Array::from_elems([4], &v).unwrap(), d)
                .unwrap()
        })
        .collect();
    let args: Vec<Vec<&Buffer>> = inputs.iter().map(|b| vec![b]).collect();
    let out = exe.execute_replicated(&args).unwrap();
    assert_eq!(out.len(), 4);
    for per_device in out {
        assert_eq!(
            per_device[0].to_host().unwrap().data(),
            &[6.0, 60.0, 4.0, -6.0]
        );
    }
}

#[test]
fn an_executable_survives_serialization() {
    let client = Client::cpu(1).unwrap();
    let exe = client
        .compile(ADD.as_bytes(), &CompileOptions::default())
        .unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let back = client.deserialize(&bytes).unwrap();
    assert_eq!(back.num_outputs(), 1);
    let a = Array::from_elems([2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let ba = client.upload(&a, 0).unwrap();
    let out = back.execute(&[&ba, &ba]).unwrap();
    assert_eq!(
        out[0].to_host().unwrap().data(),
        &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    );
    // Garbage is an error, not a crash.
    assert!(client.deserialize(b"not an executable").is_err());
    assert!(client.deserialize(&bytes[..bytes.len() / 2]).is_err());
}
