//! The GPU decoder's resampling kernels (`src/cuda/resize.cu`) run on the CPU against the
//! loaders' pipeline: the kernel source is compiled as C++ with an emulation of blocks and
//! threads (`kernel_on_cpu.cpp`) and must give the CPU path's samples bit for bit for train and
//! eval boxes, integer boxes of the output's size (a copy), boxes on the far edges, an upscale
//! and flips. This checks the kernels' arithmetic on any machine with a C++20 compiler (`c++`
//! or `$CXX`); on a GPU host `gpu_resampling_is_the_cpu_paths_bit_for_bit` checks them on the
//! device. Without a compiler it says so and passes.

use pinring_image::{Output, Pipeline, SampleSpec, Transform};
use std::io::Write;
use std::process::Command;

#[path = "../src/cuda/resample_cases.rs"]
mod resample_cases;

#[test]
fn the_resize_kernels_compiled_for_the_cpu_are_the_cpu_paths_bit_for_bit() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: no C++ compiler ({cxx}) to build the kernels for the CPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = SampleSpec {
        transform: Transform::TRAIN_DEFAULT,
        output: Output::U8Hwc,
        reduced_decode: false,
    };
    let mut cpu = Pipeline::new(spec).unwrap();
    let mut want = vec![0u8; spec.sample_bytes()];
    let cases_path = dir.path().join("cases.bin");
    let mut cases = std::fs::File::create(&cases_path).unwrap();
    let mut n = 0;
    for case in resample_cases::cases() {
        let (w, h) = case.size;
        for (crop, flip) in case.boxes {
            cpu.process_planned(&case.png, crop, flip, &mut want)
                .unwrap();
            cases.write_all(&w.to_le_bytes()).unwrap();
            cases.write_all(&h.to_le_bytes()).unwrap();
            for v in [crop.left, crop.top, crop.width, crop.height] {
                cases.write_all(&v.to_le_bytes()).unwrap();
            }
            cases.write_all(&u32::from(flip).to_le_bytes()).unwrap();
            cases.write_all(&case.rgb).unwrap();
            cases.write_all(&want).unwrap();
            n += 1;
        }
    }
    drop(cases);
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernel = here.join("src/cuda/resize.cu");
    let exe = dir.path().join("kernel_on_cpu");
    let built = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-o"])
        .arg(&exe)
        .arg(format!("-DKERNEL=\"{}\"", kernel.display()))
        .arg(here.join("tests/kernel_on_cpu.cpp"))
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&exe).arg(&cases_path).output().unwrap();
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "{out}");
    assert!(out.contains(&format!("{n} cases, 0 differ")), "{out}");
}
