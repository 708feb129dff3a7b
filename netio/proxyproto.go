package netio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// The PROXY protocol (HAProxy, versions 1 and 2,
// https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt): a proxy
// that accepted a client's connection sends one header before the
// client's bytes, naming the client's address. Warren reads it only from
// the peers in Config.ProxyTrusted.

const (
	proxyV1Prefix = "PROXY "
	proxyV1Max    = 107 // the whole v1 line, CRLF included
	proxyV2Sig    = "\r\n\r\n\x00\r\nQUIT\n"
)

type sigKind int

const (
	sigNone    sigKind = iota // not a PROXY header
	sigPartial                // too few bytes to tell
	sigProxy                  // a PROXY v1 or v2 signature
)

// proxySignature says whether b starts with a PROXY header's signature.
func proxySignature(b []byte) sigKind {
	for _, sig := range []string{proxyV1Prefix, proxyV2Sig} {
		n := min(len(b), len(sig))
		if string(b[:n]) == sig[:n] {
			if n == len(sig) {
				return sigProxy
			}
			return sigPartial
		}
	}
	return sigNone
}

// parseProxyHeader parses the PROXY header at the start of b. n == 0 with a
// nil error: b holds only part of it. src is the client's address, or
// invalid for a header that names none (v1 UNKNOWN, v2 LOCAL or UNSPEC):
// then the peer's own address stands.
func parseProxyHeader(b []byte) (n int, src netip.AddrPort, err error) {
	switch proxySignature(b) {
	case sigPartial:
		return 0, src, nil
	case sigNone:
		return 0, src, errors.New("no PROXY protocol signature (a trusted proxy's connections must start with a PROXY v1 or v2 header or the Warren preamble)")
	}
	if b[0] == 'P' {
		return parseProxyV1(b)
	}
	return parseProxyV2(b)
}

func parseProxyV1(b []byte) (int, netip.AddrPort, error) {
	var src netip.AddrPort
	end := bytes.Index(b[:min(len(b), proxyV1Max)], []byte("\r\n"))
	if end < 0 {
		if len(b) >= proxyV1Max {
			return 0, src, errors.New("v1 header without CRLF within 107 bytes")
		}
		return 0, src, nil
	}
	f := strings.Split(string(b[:end]), " ")
	if len(f) >= 2 && f[1] == "UNKNOWN" {
		return end + 2, src, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return 0, src, errors.New("v1 header is not 'PROXY TCP4|TCP6 src dst sport dport'")
	}
	addrs := [2]netip.Addr{}
	for i, s := range f[2:4] {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4() != (f[1] == "TCP4") {
			return 0, src, errors.New("v1 header: bad " + f[1] + " address " + strconv.Quote(s))
		}
		addrs[i] = a
	}
	var ports [2]uint16
	for i, s := range f[4:6] {
		p, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return 0, src, errors.New("v1 header: bad port " + strconv.Quote(s))
		}
		ports[i] = uint16(p)
	}
	return end + 2, netip.AddrPortFrom(addrs[0], ports[0]), nil
}

func parseProxyV2(b []byte) (int, netip.AddrPort, error) {
	var src netip.AddrPort
	if len(b) < 16 {
		return 0, src, nil
	}
	verCmd, fam := b[12], b[13]
	size := 16 + int(binary.BigEndian.Uint16(b[14:16]))
	if verCmd>>4 != 2 {
		return 0, src, errors.New("v2 header: version " + strconv.Itoa(int(verCmd>>4)) + ", want 2")
	}
	cmd := verCmd & 0x0f
	if cmd > 1 {
		return 0, src, errors.New("v2 header: unknown command " + strconv.Itoa(int(cmd)))
	}
	addrLen := map[byte]int{0x00: 0, 0x11: 12, 0x21: 36}
	need, ok := addrLen[fam]
	if !ok && cmd == 1 {
		return 0, src, errors.New("v2 header: address family/protocol 0x" + strconv.FormatUint(uint64(fam), 16) + " is not TCP over IPv4 or IPv6")
	}
	if cmd == 1 && size-16 < need {
		return 0, src, errors.New("v2 header: " + strconv.Itoa(size-16) + " address bytes, too few for its family")
	}
	if len(b) < size {
		return 0, src, nil
	}
	if cmd == 0 { // LOCAL: the proxy's own connection (a health check)
		return size, src, nil
	}
	switch fam {
	case 0x11:
		a := netip.AddrFrom4([4]byte(b[16:20]))
		src = netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[24:26]))
	case 0x21:
		a := netip.AddrFrom16([16]byte(b[16:32]))
		src = netip.AddrPortFrom(a, binary.BigEndian.Uint16(b[48:50]))
	}
	return size, src, nil
}
