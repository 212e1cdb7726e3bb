// Package attacktest holds black-box tests of the second hardening round (docs/SECURITY.md,
// "Hostile input" and "Resource limits"): each test drives a whole carehub node
// (e2e/servertest) through its public API as an attacker holding one ordinary key would,
// and fails without the fix it names. One file per finding.
//
// It has no code of its own beyond this comment.
package attacktest
