//! Parquet encoding of table parts: zstd, page statistics, row groups small enough
//! for SQL predicates to skip most of a large table.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

const ROW_GROUP_ROWS: usize = 64 * 1024;

pub fn encode(schema: SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>, ParquetError> {
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_created_by(format!("petting {}", env!("CARGO_PKG_VERSION")))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(properties))?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.into_inner()
}

pub fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ParquetError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.with_batch_size(8192).build()?;
    reader.collect::<Result<Vec<_>, _>>().map_err(ParquetError::from)
}
