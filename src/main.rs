mod cli;

fn main() -> std::process::ExitCode {
    petting::allocator::keep_freed_memory();
    cli::main()
}
