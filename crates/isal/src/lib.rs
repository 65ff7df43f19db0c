//! Intel ISA-L's erasure-coding functions, loaded from the system at run time.
//!
//! Tessera's codec is written from scratch; ISA-L is its peer. Tests compare
//! parity bytes with it and `tessera bench ec` times it on the same buffers.
//! Loading at run time keeps ISA-L out of the build: where it is not
//! installed, `Isal::load` says so and the callers skip or report null.

use libloading::Library;
use std::os::raw::{c_int, c_uchar};

/// Shared-object names tried in order (Debian's libisal2, then the dev link).
const LIBRARY_NAMES: [&str; 2] = ["libisal.so.2", "libisal.so"];

#[derive(Debug, thiserror::Error)]
pub enum IsalError {
    #[error("ISA-L is not installed (tried {names:?}): install Debian's libisal-dev or libisal2")]
    NotInstalled { names: Vec<&'static str> },
    #[error("ISA-L lacks symbol {symbol}: {source}")]
    MissingSymbol {
        symbol: &'static str,
        source: libloading::Error,
    },
    #[error("ISA-L takes at most {max} shards of at most i32::MAX bytes")]
    ShapeTooLarge { max: usize },
}

type GenMatrix = unsafe extern "C" fn(*mut c_uchar, c_int, c_int);
type InvertMatrix = unsafe extern "C" fn(*mut c_uchar, *mut c_uchar, c_int) -> c_int;
type InitTables = unsafe extern "C" fn(c_int, c_int, *mut c_uchar, *mut c_uchar);
type EncodeData = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_uchar, *mut *mut c_uchar, *mut *mut c_uchar);
type EncodeDataUpdate = unsafe extern "C" fn(c_int, c_int, c_int, c_int, *mut c_uchar, *mut c_uchar, *mut *mut c_uchar);

/// The loaded library and the functions Tessera uses.
pub struct Isal {
    gen_rs_matrix: GenMatrix,
    gen_cauchy1_matrix: GenMatrix,
    invert_matrix: InvertMatrix,
    init_tables: InitTables,
    encode_data: EncodeData,
    encode_data_update: EncodeDataUpdate,
    // Kept last so the functions above never outlive the mapping.
    _library: Library,
}

/// ISA-L's tables for a coefficient matrix (32 bytes a coefficient).
pub struct Tables {
    bytes: Vec<u8>,
    rows: usize,
    columns: usize,
}

impl Isal {
    /// Loads the system's ISA-L.
    pub fn load() -> Result<Isal, IsalError> {
        // SAFETY: loading ISA-L runs no initialisers with preconditions.
        let library = LIBRARY_NAMES
            .iter()
            .find_map(|name| unsafe { Library::new(name) }.ok())
            .ok_or(IsalError::NotInstalled {
                names: LIBRARY_NAMES.to_vec(),
            })?;
        // SAFETY: each symbol is declared with its C prototype from ISA-L's
        // erasure_code.h; the copies of the pointers are valid while `library`
        // is alive, and the struct keeps it alive.
        unsafe {
            Ok(Isal {
                gen_rs_matrix: symbol(&library, "gf_gen_rs_matrix")?,
                gen_cauchy1_matrix: symbol(&library, "gf_gen_cauchy1_matrix")?,
                invert_matrix: symbol(&library, "gf_invert_matrix")?,
                init_tables: symbol(&library, "ec_init_tables")?,
                encode_data: symbol(&library, "ec_encode_data")?,
                encode_data_update: symbol(&library, "ec_encode_data_update")?,
                _library: library,
            })
        }
    }

    /// `gf_gen_rs_matrix`: the (K+M) x K Vandermonde encoding matrix.
    pub fn gen_rs_matrix(&self, data: usize, parity: usize) -> Vec<u8> {
        self.gen(self.gen_rs_matrix, data, parity)
    }

    /// `gf_gen_cauchy1_matrix`: the (K+M) x K Cauchy encoding matrix.
    pub fn gen_cauchy1_matrix(&self, data: usize, parity: usize) -> Vec<u8> {
        self.gen(self.gen_cauchy1_matrix, data, parity)
    }

    fn gen(&self, function: GenMatrix, data: usize, parity: usize) -> Vec<u8> {
        assert!(data + parity <= 256);
        let mut matrix = vec![0u8; (data + parity) * data];
        // SAFETY: the buffer holds (K+M) x K bytes, what the function writes.
        unsafe { function(matrix.as_mut_ptr(), (data + parity) as c_int, data as c_int) };
        matrix
    }

    /// `gf_invert_matrix` of an n x n matrix; None if singular.
    pub fn invert_matrix(&self, matrix: &[u8], n: usize) -> Option<Vec<u8>> {
        assert_eq!(matrix.len(), n * n);
        let mut input = matrix.to_vec();
        let mut output = vec![0u8; n * n];
        // SAFETY: both buffers hold n x n bytes; ISA-L scribbles on the input, a copy.
        let status = unsafe { (self.invert_matrix)(input.as_mut_ptr(), output.as_mut_ptr(), n as c_int) };
        (status == 0).then_some(output)
    }

    /// `ec_init_tables` for a `rows` x `columns` row-major coefficient matrix.
    pub fn init_tables(&self, rows: usize, columns: usize, coefficients: &[u8]) -> Tables {
        assert_eq!(coefficients.len(), rows * columns);
        let mut input = coefficients.to_vec();
        let mut bytes = vec![0u8; rows * columns * 32];
        // SAFETY: ISA-L reads rows x columns coefficients and writes 32 bytes for each.
        unsafe { (self.init_tables)(columns as c_int, rows as c_int, input.as_mut_ptr(), bytes.as_mut_ptr()) };
        Tables { bytes, rows, columns }
    }

    /// `ec_encode_data`: `outputs = tables x inputs`.
    pub fn encode_data(&self, tables: &Tables, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), IsalError> {
        let len = check_shape(tables, inputs.len(), outputs.iter().map(|o| o.len()), inputs)?;
        let mut input_pointers: Vec<*mut c_uchar> = inputs.iter().map(|i| i.as_ptr().cast_mut()).collect();
        let mut output_pointers: Vec<*mut c_uchar> = outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        // SAFETY: the shapes were checked; ISA-L only reads the inputs and tables.
        unsafe {
            (self.encode_data)(
                len as c_int,
                tables.columns as c_int,
                tables.rows as c_int,
                tables.bytes.as_ptr().cast_mut(),
                input_pointers.as_mut_ptr(),
                output_pointers.as_mut_ptr(),
            )
        };
        Ok(())
    }

    /// `ec_encode_data_update`: `outputs ^= column `index` of tables x input`.
    pub fn encode_data_update(
        &self,
        tables: &Tables,
        index: usize,
        input: &[u8],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), IsalError> {
        assert!(index < tables.columns);
        assert_eq!(outputs.len(), tables.rows);
        assert!(outputs.iter().all(|o| o.len() == input.len()));
        if input.len() > i32::MAX as usize {
            return Err(IsalError::ShapeTooLarge { max: 256 });
        }
        let mut output_pointers: Vec<*mut c_uchar> = outputs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        // SAFETY: the shapes were checked; ISA-L only reads the input.
        unsafe {
            (self.encode_data_update)(
                input.len() as c_int,
                tables.columns as c_int,
                tables.rows as c_int,
                index as c_int,
                tables.bytes.as_ptr().cast_mut(),
                input.as_ptr().cast_mut(),
                output_pointers.as_mut_ptr(),
            )
        };
        Ok(())
    }
}

fn check_shape(
    tables: &Tables,
    input_count: usize,
    output_lens: impl Iterator<Item = usize>,
    inputs: &[&[u8]],
) -> Result<usize, IsalError> {
    assert_eq!(input_count, tables.columns);
    let len = inputs.first().map_or(0, |i| i.len());
    assert!(inputs.iter().all(|i| i.len() == len));
    let mut output_count = 0;
    for output_len in output_lens {
        assert_eq!(output_len, len);
        output_count += 1;
    }
    assert_eq!(output_count, tables.rows);
    if len > i32::MAX as usize || tables.columns > 256 {
        return Err(IsalError::ShapeTooLarge { max: 256 });
    }
    Ok(len)
}

unsafe fn symbol<T: Copy>(library: &Library, name: &'static str) -> Result<T, IsalError> {
    library
        .get::<T>(name.as_bytes())
        .map(|s| *s)
        .map_err(|source| IsalError::MissingSymbol { symbol: name, source })
}
