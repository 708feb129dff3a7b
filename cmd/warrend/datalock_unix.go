//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockDataDir takes an exclusive flock on the data directory itself (no
// file is written: a start refused later leaves the directory as it was),
// held until the returned file is closed or the process ends, a kill -9
// included. A second warrend on the same --data would otherwise open the
// same log and write the same WAL, snapshot and incarnation files as the
// first, each overwriting what the other wrote.
//
// A filesystem that does not take flocks (some network and FUSE ones) is
// not a reason to refuse the start: the error comes back as unlocked, for
// a warning, and warrend runs unguarded as before.
func lockDataDir(dir string) (f *os.File, unlocked, err error) {
	f, err = os.Open(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("data directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("data directory %s is in use by another warrend (it holds the directory's lock): stop that one first, or give this one a --data of its own", dir)
		}
		return nil, err, nil
	}
	return f, nil, nil
}
