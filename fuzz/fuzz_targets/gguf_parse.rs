//! Fuzzes the whole load path on arbitrary bytes: GGUF parse, model config,
//! weight binding, tokenizer construction. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = ds4::gguf::GgufFile::from_vec(data.to_vec()) {
        for t in f.tensor_infos() {
            let _ = f.view(t);
        }
        if let Ok(c) = ds4::model::ModelConfig::from_gguf(&f) {
            let _ = ds4::model::Weights::bind(&f, &c);
        }
        let _ = ds4::tokenizer::Tokenizer::from_gguf(&f);
    }
});
