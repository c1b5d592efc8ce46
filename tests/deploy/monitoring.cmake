# Prometheus/Grafana files of deploy/ (label deploy): the rules and config checked and
# unit-tested by promtool, the dashboard compared with its generator and checked for
# structure, and every panel query and recording rule answered by a real Prometheus scraping
# a real `snapserve serve` under load (skipped, 77, without the model or Prometheus).
add_test(NAME test_prometheus_rules
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_monitoring_rules.py ${CMAKE_SOURCE_DIR})
set_tests_properties(test_prometheus_rules PROPERTIES LABELS "deploy" SKIP_RETURN_CODE 77 TIMEOUT 120)

add_test(NAME test_grafana_dashboard_static
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_monitoring_dashboard.py ${CMAKE_SOURCE_DIR})
set_tests_properties(test_grafana_dashboard_static PROPERTIES LABELS "deploy" TIMEOUT 60)

# With CUDA also a `serve --device cuda` on the host twin (kernels/cuda/host), for the GPU row.
set(live_device_server)
if(TARGET snapserve_host_twin)
  set(live_device_server $<TARGET_FILE:snapserve_host_twin>)
endif()
add_test(NAME test_grafana_dashboard_live
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_monitoring_live.py
                 ${CMAKE_SOURCE_DIR} $<TARGET_FILE:snapserve> ${live_device_server})
set_tests_properties(test_grafana_dashboard_live PROPERTIES LABELS "deploy" SKIP_RETURN_CODE 77 TIMEOUT 600
                     RESOURCE_LOCK cores ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
