// Package segment is Warren's storage engine: the node's log, shared by
// every raft group on the node, with group commit and crash-safe recovery.
// It knows nothing of raft or queues beyond "group id, index, term, bytes".
//
// # File format
//
// One log file per node (wal-000001.log) starts with a 16-byte header:
//
//	0          8            12         16
//	+----------+------------+----------+
//	| WRNSEG01 | generation | reserved |
//	+----------+------------+----------+
//
// followed by records, each 8-byte aligned (record.go has the byte
// diagram): crc32c | length | generation | type | payload | zero pad. The
// CRC-32C (Castagnoli) covers the header after the CRC and the payload.
// Record types: entries (one group's contiguous entries: group u64,
// count u32, then per entry index u64, term u64, length u32, data), hard
// state (group, term, vote, commit), truncate (group, from) and compact
// (group, up-to). All integers are little-endian. The constants are part of
// the format.
//
// # Writing
//
// Append encodes its records into a shared pending buffer and waits. The
// first waiter with no write in flight becomes the writer: it takes
// everything pending, writes it with one pwrite at the end of the file,
// calls fdatasync once, applies it to the in-memory index and wakes every
// waiter it covered (group commit). Writes never go through a mapping.
// Any write or fsync failure stops the engine for good (ErrStopped): after
// a failed fsync the kernel may have dropped the data, so the process must
// restart and recover rather than carry on.
//
// # Recovery
//
// Open reads the file and replays every record into the index. The first
// record that does not decode ends the scan. If no intact record follows it,
// it is a torn tail (a partial last write, or zeros) and is cut. If intact
// records do follow, it is corruption in the middle: Open refuses with
// ErrCorrupt, naming the offset and the groups and indexes that follow the
// damage; with Options.Repair it truncates there instead, with an
// error-level log line.
//
// # Not built yet
//
// The design (DESIGN.md §5, RabbitMQ Ra's layout) moves entries from this
// shared log into per-group segment files with a background flusher,
// deletes log files once flushed, and drops or compacts segment files by
// the queue's live indexes. Here there is one log file that grows until the
// process is restarted with a fresh directory, and Compact only forgets
// index entries. Reads: EntriesView returns views into a read-only,
// reference-counted mmap of the log (remapped larger as it grows; an old
// mapping is unmapped only when its last view is released); Entries copies
// with pread.
package segment
