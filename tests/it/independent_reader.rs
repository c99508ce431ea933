//! Parquet written by the store, read back by readers that share no code with ours:
//! the parquet crate's record-level reader (no Arrow involved) and, when the test
//! set-up provides it (scripts/test.sh sets PETTING_PYTHON), pyarrow's C++ reader.

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, List};
use petting::tables::TurnRow;

use crate::support::{block_on, synthetic};

fn committed_run() -> (tempfile::TempDir, Vec<(std::path::PathBuf, Vec<TurnRow>)>) {
    let dir = tempfile::tempdir().unwrap();
    let store = petting::store::RunStore::open(dir.path().to_str().unwrap()).unwrap();
    let markers = block_on(synthetic::commit_turns(&store, 2, 300, 120));
    let mut files = Vec::new();
    for (iteration, marker) in markers.iter().enumerate() {
        let rows = synthetic::turn_rows(iteration as u32, 300, 7);
        let mut start = 0;
        for entry in &marker.files {
            let n = entry.rows.unwrap() as usize;
            files.push((dir.path().join(&entry.path), rows[start..start + n].to_vec()));
            start += n;
        }
    }
    (dir, files)
}

fn list_of_i32(list: &List) -> Vec<i32> {
    list.elements().iter().map(|f| if let Field::Int(v) = f { *v } else { panic!("{f:?}") }).collect()
}

fn list_of_f32(list: &List) -> Vec<f32> {
    list.elements().iter().map(|f| if let Field::Float(v) = f { *v } else { panic!("{f:?}") }).collect()
}

#[test]
fn the_record_level_parquet_reader_sees_the_same_values() {
    let (_dir, files) = committed_run();
    for (path, expected) in files {
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let codec = reader.metadata().row_group(0).column(0).compression();
        assert!(format!("{codec:?}").starts_with("ZSTD"), "{codec:?}");
        let rows: Vec<_> = reader.get_row_iter(None).unwrap().map(Result::unwrap).collect();
        assert_eq!(rows.len(), expected.len());
        for (row, want) in rows.iter().zip(&expected) {
            let get =
                |name: &str| row.get_column_iter().find(|(n, _)| n.as_str() == name).map(|(_, f)| f.clone()).unwrap();
            assert_eq!(get("candidate_id"), Field::Str(want.candidate_id.clone()));
            assert_eq!(get("policy_version"), Field::UInt(want.policy_version));
            assert_eq!(get("local_reward"), Field::Double(want.local_reward));
            assert_eq!(get("selected"), Field::Bool(want.selected));
            let parent = match want.parent_id {
                Some(v) => Field::UInt(v),
                None => Field::Null,
            };
            assert_eq!(get("parent_id"), parent);
            let Field::ListInternal(tokens) = get("response_tokens") else { panic!("not a list") };
            assert_eq!(list_of_i32(&tokens), want.response_tokens);
            let Field::ListInternal(logprobs) = get("response_logprobs") else { panic!("not a list") };
            assert_eq!(list_of_f32(&logprobs), want.response_logprobs);
        }
    }
}

#[test]
fn pyarrow_reads_the_same_values_with_the_hive_partition() {
    let Some(python) = std::env::var_os("PETTING_PYTHON") else {
        eprintln!("PETTING_PYTHON is not set (scripts/test.sh sets it): pyarrow check skipped");
        return;
    };
    let (dir, files) = committed_run();
    let paths: Vec<String> = files.iter().map(|(p, _)| p.to_string_lossy().into_owned()).collect();
    let script = r#"
import json, sys
import pyarrow.dataset as ds
files = json.loads(sys.argv[1])
table = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=sys.argv[2]).to_table()
print(json.dumps({c: table.column(c).to_pylist() for c in ["candidate_id", "iteration", "local_reward", "response_tokens"]}))
"#;
    let output = std::process::Command::new(python)
        .args(["-c", script, &serde_json::to_string(&paths).unwrap(), dir.path().to_str().unwrap()])
        .output()
        .expect("PETTING_PYTHON runs");
    assert!(output.status.success(), "pyarrow failed: {}", String::from_utf8_lossy(&output.stderr));
    let got: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let expected: Vec<(TurnRow, i64)> = files
        .iter()
        .flat_map(|(path, rows)| {
            let iteration = if path.to_string_lossy().contains("iteration=1") { 1 } else { 0 };
            rows.iter().map(move |r| (r.clone(), iteration))
        })
        .collect();
    let ids: Vec<String> = serde_json::from_value(got["candidate_id"].clone()).unwrap();
    let iterations: Vec<i64> = serde_json::from_value(got["iteration"].clone()).unwrap();
    let rewards: Vec<f64> = serde_json::from_value(got["local_reward"].clone()).unwrap();
    let tokens: Vec<Vec<i32>> = serde_json::from_value(got["response_tokens"].clone()).unwrap();
    assert_eq!(ids, expected.iter().map(|(r, _)| r.candidate_id.clone()).collect::<Vec<_>>());
    assert_eq!(iterations, expected.iter().map(|(_, k)| *k).collect::<Vec<_>>());
    assert_eq!(rewards, expected.iter().map(|(r, _)| r.local_reward).collect::<Vec<_>>());
    assert_eq!(tokens, expected.iter().map(|(r, _)| r.response_tokens.clone()).collect::<Vec<_>>());
}
