#!/usr/bin/env bash
# Does the Gateway remove a client's override header before anything reads it? With Envoy
# Gateway the removal is a ClientTrafficPolicy on the Gateway, and it can be dropped silently:
# a second policy on the same Gateway (or listener) is Conflicted and not applied, a policy on
# one listener (sectionName) overrides the whole-Gateway one there, while the
# BackendTrafficPolicy still makes the route's clusters obey the header. Then a client's forged
# header picks the host whenever the plugin is not running. This reads what Envoy Gateway
# accepted (the policies' status) and says, listener by listener, whether the policy in force
# removes the header.
#
#   envoy-config/envoy-gateway/check-header-removal.sh [-n NAMESPACE] [GATEWAY] [HEADER]
#
# Defaults: namespace default, Gateway eg, header x-ewma-lb-host (the plugin's override_header).
# Needs kubectl (read access to gateways and clienttrafficpolicies) and jq.
# Exit 0: every listener's policy in force removes the header. 1: some listener's does not, or
# none is in force (printed with the reason). 2: could not tell (usage, kubectl, a policy that
# selects Gateways by labels, which this does not resolve).
set -euo pipefail

usage() { echo "usage: $0 [-n NAMESPACE] [GATEWAY] [HEADER]" >&2; exit 2; }
namespace=default
while getopts n:h opt; do
  case $opt in
    n) namespace=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -le 2 ] || usage
gateway=${1:-eg}
header=${2:-x-ewma-lb-host}
for tool in kubectl jq; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$0: $tool is not installed" >&2; exit 2; }
done

gateway_json=$(kubectl get gateways.gateway.networking.k8s.io "$gateway" -n "$namespace" -o json) ||
  { echo "$0: cannot read Gateway $namespace/$gateway" >&2; exit 2; }
policies_json=$(kubectl get clienttrafficpolicies.gateway.envoyproxy.io -n "$namespace" -o json) ||
  { echo "$0: cannot read the ClientTrafficPolicies of $namespace" >&2; exit 2; }

# Envoy Gateway applies, per listener, the accepted policy naming that listener (sectionName),
# else the accepted policy naming the whole Gateway; a policy whose Accepted condition is not
# True (Conflicted: another policy took that Gateway or listener first) is not applied at all
# (envoyproxy/gateway internal/gatewayapi/clienttrafficpolicy.go). Header names compare without
# case, as HTTP's do.
report=$(jq -n -r --argjson gw "$gateway_json" --argjson policies "$policies_json" --arg header "$header" '
  ($header | ascii_downcase) as $h
  | $gw.metadata.name as $g
  | [ $policies.items[]
      | . as $p
      | ($p.spec.targetRefs // [])[]
      | select(.kind == "Gateway" and .name == $g)
      | (.sectionName // null) as $section
      | ([ ($p.status.ancestors // [])[]
           | select(.ancestorRef.kind == "Gateway" and .ancestorRef.name == $g
                    and (.ancestorRef.sectionName // null) == $section)
           | (.conditions // [])[]
           | select(.type == "Accepted") ] | .[0]) as $accepted
      | { policy: $p.metadata.name,
          section: $section,
          accepted: ($accepted.status == "True"),
          why: (if $accepted == null then "no status from Envoy Gateway yet"
                else "\($accepted.reason): \($accepted.message)" end),
          removes: any(($p.spec.headers.earlyRequestHeaders.remove // [])[]; ascii_downcase == $h) } ]
    as $attached
  | ( $policies.items[] | select((.spec.targetSelectors // []) | length > 0)
      | "UNKNOWN ClientTrafficPolicy \(.metadata.name) selects Gateways by labels: not judged here" ),
    ( $attached[] | select(.accepted | not)
      | "note    ClientTrafficPolicy \(.policy)\(if .section then " (listener \(.section))" else "" end) is not applied: \(.why)" ),
    ( $gw.spec.listeners[].name as $l
      | ([ $attached[] | select(.accepted and .section == $l) ] | .[0]) as $own
      | ([ $attached[] | select(.accepted and .section == null) ] | .[0]) as $whole
      | ($own // $whole) as $in_force
      | if $in_force == null then
          "MISSING listener \($l): no accepted ClientTrafficPolicy, nothing removes \($header)"
        elif $in_force.removes then
          "ok      listener \($l): ClientTrafficPolicy \($in_force.policy) removes \($header)"
        else
          "MISSING listener \($l): ClientTrafficPolicy \($in_force.policy) is in force and does not remove \($header): add it to its headers.earlyRequestHeaders.remove"
        end )
')
echo "Gateway $namespace/$gateway, header $header:"
echo "$report"
if grep -q '^UNKNOWN' <<<"$report"; then
  exit 2
fi
if grep -q '^MISSING' <<<"$report" || ! grep -q '^ok' <<<"$report"; then
  exit 1
fi
