// Package wire is the Warren protocol v1 codec: frame layout, encoders,
// decoders, limits and the error catalogue. spec/PROTOCOL.md is the
// normative description for client authors; this package is its
// implementation and spec/vectors its byte-exact test suite.
//
// # Frames
//
// After the 8-byte preamble ("WARREN", major, minor), both directions are a
// sequence of frames:
//
//	0               4       5       6               8
//	+---------------+-------+-------+---------------+==================+
//	| length  (u32) | type  | flags | channel (u16) | payload (length) |
//	+---------------+-------+-------+---------------+==================+
//
// All integers are little-endian: every CPU Warren runs on is, so a field
// is one load with no swap. length counts the payload only; the frame size
// 8+length is checked against the negotiated max frame size as soon as the
// header is in (Split), so an oversized frame is refused before any of it is
// buffered. The numeric values of types, flags, codes, property ids and
// value kinds are part of the format and never change meaning.
//
// # Using the codec
//
// Receiving: call Split on the connection's buffered bytes in a loop; it
// returns one frame per call (n == 0 means "need more bytes"). Batch frames
// have view decoders that validate the whole frame and allocate nothing:
// DecodePublish, DecodeDeliver, DecodeReturn, DecodeSettle, DecodeConfirm.
// A decoded batch aliases the input buffer (or the Decompressor's buffer for
// a compressed batch) and dies with it; copy what must outlive the read.
// Every other frame, and every frame in allocating form, comes from Decode,
// whose results are owned copies that outlive the buffer (tables included:
// DecodeTable and DecodeProps copy too). A function that returns views says
// so in its first doc line.
//
// Sending: encoders append to a caller-owned slice. Batch frames are built in
// place: BeginPublish / BeginDeliver / BeginReturn, then AppendMessage /
// AppendDelivery / AppendReturned per entry, then BatchMark.End (or
// EndCompressed). AppendSettle and AppendConfirm take slices of entries;
// AppendFrame encodes any materialized Body.
//
// Errors: every decode failure is an *Error whose Code is in the catalogue
// (errors.go); its Scope says whether it closes the connection, the channel,
// or nothing. Malformed input never panics (FuzzDecode checks this); an
// encoder given a value the format cannot hold (a name over 255 bytes) panics,
// since validating names is the caller's job.
package wire
