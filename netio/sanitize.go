package netio

import (
	"encoding/binary"

	"github.com/warren-mq/warren/wire"
)

// stripProperty removes property id from a valid property block (entries
// id u8 | len u16 | value, spec §10.1) in place and returns the shortened
// block; the block is returned unchanged if it lacks id. It allocates
// nothing.
func stripProperty(block []byte, id wire.PropID) []byte {
	for off := 0; off+3 <= len(block); {
		n := 3 + int(binary.LittleEndian.Uint16(block[off+1:]))
		if off+n > len(block) {
			break
		}
		if wire.PropID(block[off]) == id {
			return append(block[:off], block[off+n:]...)
		}
		off += n
	}
	return block
}
