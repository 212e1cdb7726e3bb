// Package egress guards carehub's outbound connections to addresses that callers choose, such as
// webhook receivers and external inference servers, against server-side request forgery (SSRF
// protection, DECISIONS §5). A URL is checked when it is configured (CheckURL: absolute, https,
// no credentials, no literal address or localhost name that is not public), and the dialer
// checks again, after name resolution, every address it connects to (DialControl), so a name
// that resolves to a private address, or changes its answer between the check and the
// connection (DNS rebinding), is refused before any byte is sent.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"

	"carehub/kernel/fault"
)

// ErrForbidden is returned (wrapped) when a connection would go to an address that is not
// public unicast: private, loopback, link-local, unspecified, multicast, CGNAT and other
// special-purpose ranges (SSRF protection, DECISIONS §5).
var ErrForbidden = errors.New("destination is not a public address")

// forbiddenPrefixes are the special-purpose ranges that the netip predicates do not name.
var forbiddenPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (CGNAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("100::/64"),        // discard-only
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
}

// nat64 is the well-known NAT64 prefix: its addresses embed an IPv4 address that is checked too.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// PublicAddr reports whether ip is an address an outbound connection may go to when private
// destinations are not allowed.
func PublicAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return false
	}
	for _, p := range forbiddenPrefixes {
		if p.Contains(ip) {
			return false
		}
	}
	if nat64.Contains(ip) {
		b := ip.As16()
		return PublicAddr(netip.AddrFrom4([4]byte(b[12:16])))
	}
	if ip.Is6() && ip.As16()[0] == 0x20 && ip.As16()[1] == 0x02 { // 6to4 2002::/16 embeds IPv4
		b := ip.As16()
		return PublicAddr(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return true
}

// DialControl is a net.Dialer Control function for outbound connections. It runs after name
// resolution, on the very address being connected to, so a name that resolves to a private
// address (or changes its answer between a check and the connection: DNS rebinding) is refused
// with an error that wraps ErrForbidden.
func DialControl(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbidden, address)
	}
	if !PublicAddr(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrForbidden, ap.Addr())
	}
	return nil
}

// MaxURLLength bounds a destination URL.
const MaxURLLength = 2048

// CheckURL validates a destination URL when it is configured or used: absolute, https (http too
// when allowPrivate), a host, no credentials or fragment. A literal address or a localhost name
// must be public unless allowPrivate. Names are not resolved here (the answer could change
// before the connection anyway); DialControl checks every address the dialer connects to.
// Refusals are fault.Validation errors on the field "url".
func CheckURL(raw string, allowPrivate bool) error {
	if raw == "" {
		return fault.Validation("url is required", map[string]string{"url": "required"})
	}
	if len(raw) > MaxURLLength {
		return fault.Validation("url is too long", map[string]string{"url": fmt.Sprintf("at most %d characters", MaxURLLength)})
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return fault.Validation("url is not an absolute URL", map[string]string{"url": "must be an absolute https URL"})
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && allowPrivate:
	default:
		return fault.Validation("url must use https", map[string]string{"url": "must use https"})
	}
	if u.User != nil {
		return fault.Validation("url must not carry credentials", map[string]string{"url": "must not contain user info"})
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return fault.Validation("url must not carry a fragment", map[string]string{"url": "must not contain a fragment"})
	}
	if allowPrivate {
		return nil
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return fault.Validation("url must point at a public address", map[string]string{"url": "loopback destinations are not allowed"})
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && !PublicAddr(ip) {
		return fault.Validation("url must point at a public address", map[string]string{"url": "private, loopback, link-local and other special-purpose addresses are not allowed"})
	}
	if ip := net.ParseIP(host); ip == nil && looksNumeric(host) {
		// Forms such as 2130706433 or 0x7f.1 that some resolvers read as IPv4 literals.
		return fault.Validation("url host is not a valid name", map[string]string{"url": "numeric hosts must be dotted-quad IPv4 or IPv6"})
	}
	return nil
}

// looksNumeric reports whether host's last label is a number (decimal, or hex with 0x): no
// top-level domain is, but resolvers that follow inet_aton read such names (2130706433, 0x7f.1,
// 127.1) as IPv4 literals. The dialer would judge the address anyway; this refuses early.
func looksNumeric(host string) bool {
	last := host[strings.LastIndexByte(host, '.')+1:]
	if last == "" {
		return false
	}
	if hex, ok := strings.CutPrefix(last, "0x"); ok {
		last = hex
		return strings.Trim(last, "0123456789abcdef") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}
