//go:build !unix

package main

import "os"

// lockDataDir does nothing where flock is not available.
func lockDataDir(string) (*os.File, error) { return nil, nil }
