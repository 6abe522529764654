// Reports a failed write to standard output (a full disk, /dev/full, a
// closed pipe with SIGPIPE ignored) instead of exiting 0 with the output
// lost: stdio buffers what a program prints and only a flush, often the
// one at exit, finds that the write failed.
//
// A program writes its report with write_stdout() (or any stdio call) and
// calls finish_stdout() before it exits; the caller prints the message as
// its other errors ("inspect: cannot write to standard output: No space
// left on device") and exits 1.
#pragma once

#include <initializer_list>
#include <string_view>

namespace qtk {

// fwrite()s `text` to stdout; a failed write is remembered (with its errno)
// for finish_stdout().
void write_stdout(std::string_view text);

// Flushes stdout now (output shown as it is made); a failed flush is
// remembered (with its errno) for finish_stdout().
void flush_stdout();

// Flushes stdout. Throws qtk::Error("cannot write to standard output:
// <reason>") when the flush, a write_stdout() or any earlier write to stdout
// failed.
void finish_stdout();

// Makes SIGXFSZ non-fatal for the process: past a file-size limit
// (`ulimit -f`) a write to stdout then fails with EFBIG, which
// finish_stdout() reports ("cannot write to standard output: File too
// large", exit 1), instead of the kernel killing the program mid-output
// (exit 153 and no message of its own). Every program that prints its
// results to stdout calls it first.
void ignore_file_size_signal();

// Opens /dev/null on each of `fds` (0, 1, 2) that is closed (`2>&-`).
// note: otherwise the first file the program opens gets that number, and
// what the program prints there lands in that file (convert's --progress
// lines went into its temporary pack). Best effort: a failure leaves the
// descriptor closed.
void open_closed_standard_fds(std::initializer_list<int> fds);

}  // namespace qtk
