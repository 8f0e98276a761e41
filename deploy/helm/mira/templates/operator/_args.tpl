{{- define "mira.operatorLeaseName" -}}
{{- default (printf "%s-operator" (include "mira.fullname" .)) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{- define "mira.operatorArgs" -}}
{{- $v := .Values.operator -}}
- operator
- --catalog={{ include "mira.catalogEndpoints" . }}
- --listen=0.0.0.0:8080
{{- with $v.watchNamespace }}
- --namespace={{ . }}
{{- end }}
- --leader-elect={{ $v.leaderElection.enabled }}
- --lease-name={{ include "mira.operatorLeaseName" . }}
- --lease-namespace=$(POD_NAMESPACE)
- --identity=$(POD_NAME)
- --requeue-s={{ $v.requeueSeconds }}
- --catalog-timeout-ms={{ $v.catalogTimeoutMs }}
{{- range $ns, $tenants := $v.namespaceTenants }}
- --namespace-tenants={{ $ns }}={{ join "," $tenants }}
{{- end }}
{{- if not $v.namespaceAnnotation }}
- --namespace-annotation=false
{{- end }}
{{- include "mira.securityArgs" (dict "ctx" . "auth" false) | nindent 0 }}
{{- include "mira.extraArgs" $v.extraArgs }}
{{- end }}
