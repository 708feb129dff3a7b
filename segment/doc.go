// Package segment is Warren's storage engine: one log per node, shared by
// every raft group on the node, with group commit, per-group segment
// files and crash-safe recovery. It knows nothing of raft or queues beyond
// "group id, index, term, bytes" and "these indexes are still live".
//
// # Layout
//
// RabbitMQ Ra's, so that one stuck message never pins the whole log:
//
//	dir/wal-<seq>.log             every group's appends, in arrival order
//	dir/seg-<group>-<seq>.seg     one group's entries, moved from the WAL
//
// Appends go to the current WAL file. When it passes Options.WALSize the
// next group commit starts a new one, which opens with a checkpoint: every
// group's raft range, hard state and segment files. A background worker
// then, once Options.MoveLag newer WAL files were sealed after it (so
// that what its owners compact soon is never copied), moves the entries
// still stored in the sealed WAL file (those not cut by a truncation or
// dropped by a compaction meanwhile) to the end of each group's current
// segment file, syncs them, records a promise of
// their synced size in the WAL, points the index at the copies and
// deletes the WAL file. When the worker falls Options.MaxSealedWALs
// files behind, appends go at the pace of its move, each waiting for a
// step of it (a group's copies, a file's sync), not for a whole WAL file;
// and a compaction pass goes back to the WAL files due between two
// compacted segment files, so appends never wait for a whole pass.
// A segment file is sealed at Options.SegmentSize.
// The owner tells storage which entries below its compaction point are
// live (Compact): a sealed segment file left with no stored entry is
// deleted; one whose stored entries fall below Options.CompactBelow of
// those written into it is compacted, its stored entries copied to the
// group's current segment file, then deleted.
//
// # File format
//
// Every file starts with a 16-byte header, then records:
//
//	0        6         8            12         16
//	+--------+---------+------------+----------+==========
//	| magic  | version | generation | reserved | records...
//	+--------+---------+------------+----------+==========
//
// magic is "WRNWAL" or "WRNSEG"; version (u16) is 5 (version 1 lacks
// record type 7, version 2 the footer, type 8, version 3 the live record,
// type 9, which goes only into a version-4 WAL file: an older one is
// sealed first; version 4 the write tag, which goes only into a version-5
// WAL file: appends to an older one carry none; this build reads all five
// and never writes a type-7 record into a version-1 file: RemoveGroup
// starts a new WAL file first, so a build that reads only version 1
// refuses any file that may hold one),
// and a file of a later version is refused with ErrVersion rather than
// taken for damage;
// generation is the low 32 bits of the file's sequence number (in its
// name). Each record is 8-byte aligned
// (record.go has the byte diagram): crc32c | length | generation | type |
// write tag (u24) | payload | zero pad. The CRC-32C (Castagnoli) covers the header after the
// CRC and the payload; the generation must be the file's, so bytes left
// from another use of the space are never taken for records. The write
// tag (version 5, WAL files only; zero elsewhere) names the group-commit
// write that wrote the record: bits 0-21 its number in the file (the
// first write, with the checkpoint, is 1; wrapping from 2^22-1 to 1), bit
// 22 set when the write started with no other in flight, bit 23 on the
// write's last record. Record types:
//
//	1 entries     group u64, count u32, count × (index u64, term u64, len u32, data)
//	2 hard state  group u64, term u64, vote u64, commit u64
//	3 truncate    group u64, from u64
//	4 compact     group u64, upTo u64, term of upTo u64 (0: unknown)
//	5 checkpoint  group u64, first u64, last u64, term of first-1 u64, term u64, vote u64,
//	              commit u64, flags u64 (bit 0: hard state set; bit 1: quarantined),
//	              n u64, n × (segment seq u64, size u64)
//	6 promise     group u64, segment seq u64, size u64 (segment 0, which never exists:
//	              an empty promise, a WAL file's checkpoint when the log holds no group)
//	7 remove      group u64 (version 2)
//	9 live        as entries (type 1), stored below the group's raft log, placed
//	              by the higher-term rule, not appended (version 4; WAL only)
//	8 footer      group u64, nrec u64, nrun u64, nent u64, nrec × record offset u32,
//	              nrun × (first index u64, term u64, count u64), nent × data offset u32
//	              (u32 arrays zero-padded to 8 bytes), footer offset u64, "WRNFOOT\0"
//	              (version 3; segment files only, last)
//
// Segment files hold only entries records, and a sealed one ends with
// its index footer (type 8): every entry in file order, as runs of
// consecutive indexes of one term, and where each record starts. The
// payload ends with the footer's own offset and a magic, so the file's
// last 16 bytes find it. All integers are
// little-endian. The constants are part of the format.
//
// # Writing
//
// Append encodes its records into a shared pending buffer and waits. A
// waiter whose records are still pending becomes the writer when no other
// pwrite is running and fewer than two writes are in flight: it takes
// everything pending, sets the records' generation and checksums, writes
// them with one pwrite at the end of the WAL file (or into a new one),
// lets the next writer start, calls fdatasync, and once every earlier
// write is applied, applies its own to the index and wakes every waiter
// it covered (group commit, pipelined two deep: a disk completes
// overlapping flushes faster than one after another). Each write's
// records carry its write tag, so recovery knows which writes may have
// been in flight together. A new WAL file is
// started only with nothing in flight, so its checkpoint follows every
// record before it. Writes never go through a mapping. Any write
// or fsync failure stops the engine for good (ErrStopped): after a failed
// fsync the kernel may have dropped the data, so the process must restart
// and recover rather than carry on. New files are made durable in their
// directory (fsync of the directory) before anything depends on them, and
// deletions before anything assumes them gone.
//
// # Reading
//
// The index keeps, per group, runs of consecutive indexes with the
// offset of each entry's data in its file: 4 bytes per entry. The entry
// header before the data gives its index, term and length, so a read
// checks it found the index it asked for. EntriesView returns views into
// a read-only, reference-counted mmap of each file (remapped larger as a
// file grows; a mapping is unmapped only when it is no longer current and
// its last view is released, even after its file is deleted); Entries
// copies. A mapped file is never shrunk: recovery drops the mapping before
// it cuts a torn tail.
//
// # Recovery
//
// Open lists the files. It first gathers what the WAL files promise about
// segment sizes (checkpoints and promise records). It loads every group's
// segment files in order: a sealed file with an intact footer (its
// checksum and structure check) from the footer alone, without reading
// its records, each record then checksummed on its first read (views,
// terms, and the compaction's copies: damage found then is ErrCorrupt
// naming the file and record, never copied under a fresh checksum);
// any other file (no footer: the current one, a crash while sealing, an
// older version; or a footer that does not check) by a scan as before; of two copies of an index, the one with the
// higher term wins (raft rewrites an index only with a higher term; equal
// terms are the same entry). Then it replays the WAL files in order:
// checkpoints set each group's range and hard state, entries replay with
// raft's append semantics, truncations and compactions apply; a remove
// record drops the group (its entries, range and hard state; records of
// the id after it start a new group) and leaves its segment files to the
// worker. Last, every group's raft log [first, last] must be wholly
// stored.
//
// Installing a snapshot (a raft follower far behind): CompactAt moves the
// raft log past the snapshot's index with its term given (the entry need
// not be stored), and AppendLive then stores the snapshot's live entries
// the node did not hold below it, sparse (live records, replayed in WAL
// order like everything else, so an older truncate never cuts them).
//
// Removing a group: RemoveGroup writes a remove record and, once it is
// durable, forgets the group. The worker deletes every segment file of a
// removed group (and syncs the directory) before it deletes any WAL file,
// so the record that removes a group outlives the group's files: a crash
// in between finds the record again and drops the group again.
//
// Damage: the first record of a file that does not decode ends its scan.
// If intact records follow it, or it lies before the file's promised size
// (segments), or the file is a sealed WAL file, it is corruption: Open
// refuses with ErrCorrupt, naming the file, the offset and the groups and
// index ranges of the intact records after it. Otherwise it is a torn
// tail (a partial last write, or zeros) and is cut. One exception, in the
// active WAL file (version 5): with two writes in flight (A in its
// fdatasync, B written after it), a power cut may keep B's pages and lose
// one of A's (XFS, btrfs, ext4 data=writeback); neither was acknowledged
// (B's completion waits for A's). So damage whose intact records after it
// all belong to its own write or to the next one, where that one started
// while the damaged one was in flight (its tag lacks bit 22), is a torn
// tail too, cut from the first damaged byte with everything after it
// (keeping B would leave a hole in a raft log): a write starts only once
// the write two before it is synced, and one that started alone only once
// every earlier one is, so a record of any other write proves the damaged
// write was synced, and the damage is corruption. The file's first write
// (its checkpoint) qualifies only while an earlier WAL file is still
// there (none goes before that write is synced; a fresh log's first file
// syncs its checkpoint alone). A WAL file started while the log holds no
// group has no checkpoint record to open with: it opens with an empty
// promise instead, so that its first write always holds a record and
// damage in the write after it is told from damage in it. And a partial
// write (the first records of a torn write, kept by Open: its last
// record, with bit 23, is gone) at the end of the active WAL file would
// make damage in the next write seem to lie in it, which that write,
// started alone, proves synced: Open seals such a file and starts a new
// one (as for a quarantine, its checkpoint synced alone), so a tear of
// the first two writes after that restart is a torn tail too, at the
// cost of a WAL file. An earlier
// build of version 5 did neither: a WAL file it appended to after an
// empty checkpoint (header only) or a kept partial write still refuses
// such a tear as corruption; one it left with a header only is sealed
// at Open like a partial write. The cost of the rule: bit rot inside one
// of the last two writes, when the later one started while the earlier
// was in flight, is cut as a torn tail like bit rot in the last write,
// not reported, and both writes' records are lost although they were
// acknowledged. Close and Open narrow that to the writes just before a
// crash: Close (not after a failure: ErrStopped) ends the active WAL
// file with a close mark, an empty promise written alone as a write of
// its own (started with nothing in flight, tagged its write's last) and
// synced, and Open writes one after it has synced the active WAL file it
// kept. The mark proves every write before it synced, so damage there is
// reported (ErrCorrupt; unattributable, in the active file); damage in a
// mark that ends the file, which holds nothing, is a torn tail (a mark with
// writes after it is a synced record like any other: damage in it is
// reported). A mark that cannot be written (ENOSPC) is taken back and left
// out, so a full disk does not keep a node from starting. A file that already
// ends with a mark gets none, so opens and closes with no write between
// add nothing; otherwise each adds 40 bytes (to a full WAL file too, past
// Options.WALSize). No format change: every reader of version 5 replays
// the mark as the empty promise it is, and the mover, which reads WAL
// files through the index, never sees it. The cost remains for the last
// two writes before a crash (a process killed, a power cut) or before a
// Close by an earlier build, for damage done before the next Open. A WAL
// file of version 4 or older has no tags: damage with intact records
// after it there is corruption, as before. Segment files
// have no tags: a hole in the unsynced tail a move left (before its
// promise) with intact records after it is still reported as corruption. A raft log with a
// hole is corruption naming the group and the missing range. With
// Options.Repair, Open truncates at the damage instead, with an
// error-level log line.
//
// With Options.Quarantine, damage Open can attribute to groups
// quarantines them instead of refusing the log: they are left out of it
// (not served, every write refused with ErrQuarantined) and listed by
// Damaged (group, file, offset, why); the others open with all their
// data. Attributable: damage in a group's own segment file (a record that
// does not decode, a file shorter than its promise, a footer that does
// not check and a scan that then fails), a hole in a group's raft log, a
// hard state that commits past the group's last stored entry, entries
// that do not follow the group's log. Damage in a sealed WAL file, shared
// by every group, quarantines every group alive while it was written:
// those known when the damage is reached (the file's checkpoint lists
// every group alive when it started), those with intact records after
// it, and those in the next WAL file's checkpoint (alive when it ended).
// Damage in the active WAL file (intact records after it, and not a
// torn tail by the in-flight rule above), or a torn
// checkpoint after a damaged WAL file, cannot be bounded (a group created
// since the last checkpoint may have had records only in the damaged
// part): Open refuses with ErrCorrupt and ErrUnattributable. A group the
// WAL removes after its damage (a remove record) is not quarantined. A
// quarantined group never opens truncated: Open starts a new WAL file
// whose checkpoint marks it (flag bit 1), every later checkpoint carries
// the mark, and an Open finding the mark quarantines the group again (and
// an Open without Quarantine refuses it), also once the damage and the
// WAL files that held its records are gone. Its segment files stay on
// disk, untouched, until RemoveGroup removes it like any group; then the
// id starts empty. Open writes nothing until recovery has read the
// whole log: the torn tails it found are cut, the quarantine marked, a
// WAL file ending in a partial write sealed and the active one closed
// with a mark, only once
// Options.CheckDamage (if set) has accepted the damage found,
// so an Open that refuses, for that or any other reason, leaves the
// directory as it found it. Damage inside a record of a sealed file with an
// intact footer is not read at Open (that is the footer's point): its
// first read reports it (ErrCorrupt), as without Quarantine.
//
// Live entries below a compaction point are not
// listed on disk; the owner hands its live set to Compact after a restart,
// which reports any that are missing (ErrCorrupt), so a loss is never
// silent.
//
// # Not built yet
//
// Opening still scans each group's current (unsealed) segment file whole,
// and sealed files without a footer (written before version 3); reads
// do not re-verify checksums once checked, so damage done to a file after
// Open (or after a record's first read) is found at the next Open or first
// read; the mover copies each surviving entry once more than a shared
// log would, and syncs every touched segment file on each move (one
// fdatasync per group per WAL file).
package segment
