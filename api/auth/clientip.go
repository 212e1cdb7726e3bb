package auth

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"carehub/kernel/apikeys"
)

// ClientIP returns the socket peer address of r, unmapped (an IPv4 peer of a dual-stack listener
// is reported as IPv4), or the zero Addr when RemoteAddr is not an address.
func ClientIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// TrustedProxies returns a client-address function for AuthenticatorConfig.ClientIP that
// believes X-Forwarded-For only from the proxies named (CIDRs or addresses, --trusted-proxies):
// when the socket peer is trusted, the client is the right-most X-Forwarded-For address that is
// not itself a trusted proxy. Addresses to its left were written by the client and prove nothing.
// With no proxies it is ClientIP.
func TrustedProxies(proxies []string) (func(*http.Request) netip.Addr, error) {
	trusted := make([]netip.Prefix, 0, len(proxies))
	for _, s := range proxies {
		p, err := apikeys.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: not an IP address or CIDR", s)
		}
		trusted = append(trusted, p)
	}
	if len(trusted) == 0 {
		return ClientIP, nil
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) netip.Addr {
		peer := ClientIP(r)
		if !peer.IsValid() || !isTrusted(peer) {
			return peer
		}
		client := peer
		hops := r.Header.Values("X-Forwarded-For")
		for i := len(hops) - 1; i >= 0; i-- {
			parts := strings.Split(hops[i], ",")
			for j := len(parts) - 1; j >= 0; j-- {
				a, err := netip.ParseAddr(strings.TrimSpace(parts[j]))
				if err != nil {
					return client // a garbled hop: stop at the last address we could trust
				}
				client = a.Unmap()
				if !isTrusted(client) {
					return client
				}
			}
		}
		return client
	}, nil
}
