// Command freeports prints n loopback ports nothing listened on when
// checked, outside the kernel's ephemeral range (package freeport), on one
// line: for the Makefile's checks that start a warrend of their own.
//
//	freeports [n]    (n: 1 by default)
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/internal/freeport"
)

func main() {
	n := 1
	if len(os.Args) > 1 {
		var err error
		if n, err = strconv.Atoi(os.Args[1]); err != nil || n < 1 || n > 100 {
			fmt.Fprintln(os.Stderr, "usage: freeports [n], n from 1 to 100")
			os.Exit(2)
		}
	}
	addrs, err := freeport.Addrs(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ports := make([]string, n)
	for i, a := range addrs {
		_, ports[i], _ = net.SplitHostPort(a)
	}
	fmt.Println(strings.Join(ports, " "))
}
